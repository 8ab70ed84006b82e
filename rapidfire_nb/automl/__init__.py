"""Config surface, drop-in compatible with ``rapidfireai.automl``.

``List``/``Range`` knobs, the config wrappers (``RFModelConfig``, ``RFLoraConfig``, ``RFSFTConfig``,
``RFDPOConfig``, ``RFGRPOConfig``), the searches that expand a config group into runs (``RFGridSearch``,
``RFRandomSearch``) and the resolved run config (``LeafConfig``). Importing this package does not import
torch, transformers, trl or peft; constructing a wrapper imports trl/peft to read their field lists.
"""

from .configs import RFDPOConfig, RFGRPOConfig, RFLoraConfig, RFModelConfig, RFSFTConfig
from .knobs import List, Range
from .leaf import LeafConfig
from .search import RFGridSearch, RFRandomSearch

__all__ = [
    "LeafConfig",
    "List",
    "RFDPOConfig",
    "RFGRPOConfig",
    "RFGridSearch",
    "RFLoraConfig",
    "RFModelConfig",
    "RFRandomSearch",
    "RFSFTConfig",
    "Range",
]
