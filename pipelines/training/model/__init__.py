"""The model of the training stage, apart from the rank loop that trains it: ``build`` (network and compile),
``checkpoints``, ``finetune``, ``imagenet`` (``--weights imagenet``) and ``export`` (for batch inference)."""
