"""CP-CFL as a real Flower federation (extra ``[flower]``): the same algorithm functions
as the simulator (:mod:`cpcfl_tf.clustered.algorithm`), driven by Flower's Message API.

* :mod:`~cpcfl_tf.flower.server_app`: the ``ServerApp`` (pool, Tc phase, aggregation);
* :mod:`~cpcfl_tf.flower.client_app`: the ``ClientApp`` (own partition, selection on
  training data, the simulator's local step, evaluation on test data);
* :mod:`~cpcfl_tf.flower.loopback`: a SuperLink and K SuperNodes as processes on
  127.0.0.1, and ``flwr run`` against them.
"""
