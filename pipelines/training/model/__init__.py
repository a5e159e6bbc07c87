"""The model of the training stage, apart from the rank loop that trains it.

* :mod:`.build` - the network (a frozen backbone, dropout, a softmax head; the head alone for the
  feature cache) and its Horovod compile;
* :mod:`.checkpoints` - what a checkpoint holds (the trainable weights, the optimizer's state, the
  learning rate, the dropout's generator) and the frozen weights' checksum;
* :mod:`.finetune` - the fine-tuning recipe: which layers N blocks are, phase 2's rate;
* :mod:`.imagenet` - ``--weights imagenet``: Keras' file, fetched once before any rank;
* :mod:`.export` - ``model.keras`` and its contract ``model.json`` for batch inference.
"""
