// @ts-check
// Generated from kernel_scheduler/op_kinds.py by scripts/op_kinds_js.py: do not edit by hand.
/** The IC Op kinds (kernel_scheduler.op_kinds.OP_KINDS), in the order of the row buttons:
 * @type {{name: string, label: string, title: string, takes_changes: boolean, requested: string}[]} */
export const OP_KINDS = [
  {"name": "stop", "label": "Stop", "title": "Stop after the current chunk (all state kept; Resume continues it)", "takes_changes": false, "requested": "stop requested for run {run_id} — applies at the end of its current chunk"},
  {"name": "resume", "label": "Resume", "title": "Put the run back into the rotation", "takes_changes": false, "requested": "resume requested for run {run_id} — it rejoins the rotation at the next chunk"},
  {"name": "delete", "label": "Delete", "title": "Remove the run (hidden unless 'show deleted' is on)", "takes_changes": false, "requested": "delete requested for run {run_id} — applies at the end of its current chunk"},
  {"name": "clone", "label": "Clone…", "title": "Start a new run from this one's config, with changes", "takes_changes": true, "requested": "clone of run {run_id} requested — the new run joins at the next chunk boundary"},
];
