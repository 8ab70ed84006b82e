// The few DOM calls widgets/table.js makes, for node tests of its forms (no jsdom here): elements with children,
// attributes, data-*, listeners, closest/querySelector for `tag`, `[attr]`, `tag[attr="value"]`; focus() records
// the element in globalThis.focused. Import it before widgets/table.js.
class El {
  constructor(tag) { this.tagName = tag.toUpperCase(); this.children = []; this.parent = null; this.attrs = {};
    this.style = {}; this.dataset = {}; this.listeners = {}; this._text = ""; this.className = "";
    this.title = ""; this.disabled = false; this.value = ""; this.checked = false;
    const self = this;
    this.classList = { _s: new Set(), toggle(c, on) { if (on === undefined) on = !this._s.has(c); on ? this._s.add(c) : this._s.delete(c); }, add(c) { this._s.add(c); }, contains(c) { return this._s.has(c); } };
  }
  get textContent() { return this._text + this.children.map((c) => c.textContent).join(""); }
  set textContent(t) { this.children = []; this._text = t; }
  setAttribute(k, v) { this.attrs[k] = v; if (k === "value") this.value = v; if (k === "checked") this.checked = true;
    if (k.startsWith("data-")) this.dataset[k.slice(5).replace(/-([a-z])/g, (_, c) => c.toUpperCase())] = v; }
  getAttribute(k) { return this.attrs[k]; }
  toggleAttribute(k, on) { if (on) this.attrs[k] = ""; else delete this.attrs[k]; }
  addEventListener(ev, fn) { (this.listeners[ev] ||= []).push(fn); }
  click() { for (const fn of this.listeners.click || []) fn({ preventDefault() {} }); }
  append(...kids) { for (const k of kids) { const n = typeof k === "string" ? Object.assign(new El("#text"), { _text: k }) : k; n.remove(); n.parent = this; this.children.push(n); } }
  prepend(...kids) { for (const k of kids.reverse()) { k.remove(); k.parent = this; this.children.unshift(k); } }
  insertBefore(n, ref) { n.remove(); n.parent = this; const i = ref ? this.children.indexOf(ref) : -1; if (i < 0) this.children.push(n); else this.children.splice(i, 0, n); }
  replaceChildren(...kids) { this.children = []; this._text = ""; this.append(...kids); }
  remove() { if (this.parent) { this.parent.children = this.parent.children.filter((c) => c !== this); this.parent = null; } }
  get firstElementChild() { return this.children[0] || null; }
  get lastElementChild() { return this.children[this.children.length - 1] || null; }
  closest(sel) { let n = this; while (n) { if (n.matches(sel)) return n; n = n.parent; } return null; }
  matches(sel) { const m = sel.match(/^(\w+)?(?:\[(\w[\w-]*)(?:="?([^"\]]*)"?)?\])?$/); if (!m) return false;
    const [, tag, attr, val] = m; if (tag && this.tagName !== tag.toUpperCase()) return false;
    if (attr) { if (!(attr in this.attrs)) return false; if (val !== undefined && String(this.attrs[attr]) !== val) return false; } return true; }
  querySelector(sel) { for (const c of this.children) { if (c.matches && c.matches(sel)) return c; const r = c.querySelector?.(sel); if (r) return r; } return null; }
  querySelectorAll(sel) { const out = []; for (const c of this.children) { if (c.matches(sel)) out.push(c); out.push(...c.querySelectorAll(sel)); } return out; }
  focus() { globalThis.focused = this; }
  set innerHTML(v) { this._text = ""; }
}
globalThis.document = { createElement: (t) => new El(t) };
