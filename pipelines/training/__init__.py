"""Training: Keras model, pretrained weights and the Horovod training loop."""
