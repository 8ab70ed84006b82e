// @ts-check
/** Tiny DOM helpers shared by the panel's views and the server page. */

/**
 * Create an element: `class`, `text`, `style` (object), `on<event>` handlers and plain attributes (true: present,
 * null/undefined/false: absent), then children (null/undefined/false skipped).
 * @param {string} tag @param {Record<string, any>} [attrs] @param {...(Node|string|null|undefined|false)} kids
 * @returns {HTMLElement}
 */
export function h(tag, attrs = {}, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "style" && typeof v === "object") Object.assign(el.style, v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const kid of kids) if (kid !== null && kid !== undefined && kid !== false) el.append(kid);
  return el;
}

/** Replace an element's children (null/undefined skipped). @param {HTMLElement} el
 * @param {...(Node|string|null|undefined)} kids */
export function setKids(el, ...kids) {
  el.replaceChildren(...kids.filter((k) => k !== null && k !== undefined));
}

/** Set text (and title) only when they differ (no needless DOM writes). @param {HTMLElement} el
 * @param {string} text @param {string} [title] */
export function setText(el, text, title) {
  if (el.textContent !== text) el.textContent = text;
  if (title !== undefined && el.title !== title) el.title = title;
}
