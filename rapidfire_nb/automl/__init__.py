"""Config surface, drop-in compatible with ``rapidfireai.automl``.

``List``/``Range`` knobs, the config wrappers (``RFModelConfig``, ``RFLoraConfig``, ``RFSFTConfig``,
``RFDPOConfig``, ``RFGRPOConfig``), the searches that expand a config group into runs (``RFGridSearch``,
``RFRandomSearch``), the early-stopping policies of ``run_fit(..., early_stopping=...)`` (``SuccessiveHalving``,
``MedianStopping``) and the resolved run config (``LeafConfig``, defined in ``rapidfire_nb.spec``). Importing this package does not import
torch, transformers, trl or peft; constructing a wrapper imports trl/peft to read their field lists.
"""

from rapidfire_nb.spec import LeafConfig  # the run spec the searches expand into (public here too)

from .configs import RFDPOConfig, RFGRPOConfig, RFLoraConfig, RFModelConfig, RFSFTConfig
from .early_stopping import MedianStopping, SuccessiveHalving
from .knobs import List, Range
from .optuna_search import RFOptuna
from .search import RFGridSearch, RFRandomSearch

__all__ = [
    "LeafConfig",
    "List",
    "MedianStopping",
    "RFDPOConfig",
    "RFGRPOConfig",
    "RFGridSearch",
    "RFLoraConfig",
    "RFModelConfig",
    "RFOptuna",
    "RFRandomSearch",
    "RFSFTConfig",
    "Range",
    "SuccessiveHalving",
]
