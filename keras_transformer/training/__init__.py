"""The training stage: `model.fit` under a distribution strategy (`runner.train`), with the
paper's loss (`losses`) and rate (`schedules`), the callbacks that validate, checkpoint, stop
and log (`callbacks`), and fine-tuning from another run's weights (`fine_tuning`)."""
