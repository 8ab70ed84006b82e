"""Text metrics for generation eval (``compute_metrics`` with ``generation_config``), offline.

:func:`rouge_l` scores replies against reference answers with ROUGE-L (longest common subsequence of words) from
the ``rouge_score`` package (Google Research's implementation of ROUGE-1.5.5, Apache-2.0): no hub, no download.
``rouge_score`` is imported inside the function.
"""

from __future__ import annotations

import functools
import math
from typing import Any

__all__ = ["rouge_l"]

_INSTALL_HINT = "pip install rouge-score==0.1.2"


@functools.lru_cache(maxsize=1)
def _scorer() -> Any:
    try:
        from rouge_score import rouge_scorer
    except ImportError as err:
        raise ImportError(
            f"ROUGE-L comes from the 'rouge-score' package. Install it with: {_INSTALL_HINT}"
        ) from err
    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l(eval_preds: Any) -> dict[str, float]:
    """``compute_metrics`` for generation eval: the mean ROUGE-L F-measure of the replies against the references.

    Words are lower-cased and Porter-stemmed (``use_stemmer=True``, as the rapidfireai tutorials' ``evaluate``
    ROUGE does); each pair scores the F-measure of its longest common word subsequence, in [0, 1]; the result is
    the plain mean over the pairs (``evaluate``'s default aggregation, a bootstrap, differs slightly).

    Args:
        eval_preds: ``(predictions, references)``, two lists of strings of equal length.

    Returns:
        ``{"rougeL": mean F-measure}`` (logged as ``eval_rougeL``); NaN for no predictions.

    Raises:
        ValueError: the two lists differ in length.
        ImportError: ``rouge-score`` is not installed.
    """
    predictions, references = eval_preds
    if len(predictions) != len(references):
        raise ValueError(f"got {len(predictions)} predictions but {len(references)} references")
    if not predictions:
        return {"rougeL": math.nan}
    scorer = _scorer()
    total = sum(
        scorer.score(str(ref), str(pred))["rougeL"].fmeasure for pred, ref in zip(predictions, references)
    )
    return {"rougeL": total / len(predictions)}
