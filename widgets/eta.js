// @ts-check
/**
 * The header's time left, smoothed as tqdm smooths its rate. Each snapshot's `stats` (rapidfire_nb.view.clock
 * .progress_stats) carry the steps done, the steps still planned and the training seconds; its own `eta_s` divides
 * the steps left by the average rate since the start, which climbs while a chunk trains (no new steps, more
 * seconds) and drops when it ends, so the line jumped (0:51 -> 1:17 within a second). Here:
 *
 *   rate_k = α · (Δsteps_k / Δtrain_s_k) + (1 − α) · rate_{k−1},  α = 0.3 (tqdm's `smoothing` default),
 *   seeded with the average rate (steps_done / train_s), updated only when the steps done grew;
 *   eta   = max(0, steps_left / rate_k − (train_s_now − train_s_k)),
 *
 * i.e. the estimate made at the last step count, counted down with the training clock until the next one. Pure:
 * no DOM, node-tested (tests/rapidfire_nb/js/eta.test.mjs).
 */

/** tqdm's default smoothing factor: the weight of the newest rate in the moving average. */
export const ETA_SMOOTHING = 0.3;

/**
 * @typedef {{steps_done?: number, steps_planned?: number, elapsed_s?: number, steps_per_s?: number|null,
 *   eta_s?: number|null, training?: boolean}} EtaStats
 */

export class EtaSmoother {
  constructor(alpha = ETA_SMOOTHING) {
    this.alpha = alpha;
    /** @type {number|null} smoothed steps per training second */ this.rate = null;
    /** steps done and training seconds at the last step count */
    this.done = -1;
    this.at = 0;
    this.left = 0;
  }

  /**
   * The time left to show: null when unknown or not training (the snapshot's own `eta_s` then, i.e. none).
   * @param {EtaStats|null|undefined} stats the latest snapshot's @param {number} [trainNow] training seconds now
   * (the snapshot's `elapsed_s` moved on with the clock while training; default: the snapshot's)
   * @returns {number|null} seconds
   */
  update(stats, trainNow) {
    if (!stats || !stats.training || typeof stats.eta_s !== "number") { this.reset(); return stats?.eta_s ?? null; }
    const done = stats.steps_done ?? 0, t = stats.elapsed_s ?? 0;
    const left = Math.max(0, (stats.steps_planned ?? done) - done);
    if (left === 0) return 0;
    if (this.rate === null || done < this.done) {
      this.rate = stats.steps_per_s || null;
      this.done = done; this.at = t;
    } else if (done > this.done) {
      const dt = t - this.at;
      if (dt > 0) this.rate = this.alpha * ((done - this.done) / dt) + (1 - this.alpha) * this.rate;
      this.done = done; this.at = t;
    }
    this.left = left;
    if (!this.rate) return stats.eta_s;
    const since = Math.max(0, (trainNow ?? t) - this.at);
    return Math.max(0, left / this.rate - since);
  }

  reset() {
    this.rate = null;
    this.done = -1;
    this.at = 0;
  }
}
