"""The training layer: TRL trainers driven chunk by chunk (torch, transformers, trl and peft are imported here).

``executor.TorchExecutor`` implements ``kernel_scheduler.Executor``; ``kinds`` holds one adapter per trainer type
(``get_kind("SFT")``); ``models`` the model provider (``create_model_fn`` calls, shared bases); ``worker`` the
thread running one trainer's own ``train()``; ``checkpoint`` the boundary snapshots. It imports the run spec
(``rapidfire_nb.spec``) and the field schema, never ``rapidfire_nb.automl``. ``kinds`` and ``models`` import
no torch at module level (the experiment layer reads the warm-start rules from ``kinds``).
"""
