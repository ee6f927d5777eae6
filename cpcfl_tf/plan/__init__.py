"""The run asked for and its plan: the validated configuration, the presets, ``--set``
text, and :func:`~cpcfl_tf.plan.resolve.resolve`, which makes one run's plan once."""
