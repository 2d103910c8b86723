"""A training run's folder: its config, vocabulary, checkpoints and weight files (`folder`), the
weight files themselves, checked before they load (`weights`, and `legacy_weights` for older
layouts), and writing files safely, one process at a time (`files`)."""
