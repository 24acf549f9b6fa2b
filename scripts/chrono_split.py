"""The corpus's chronological held-out part, one definition for the model's
training (scripts/train_attribution_model.py) and its evaluation
(bench/attribution_eval.py): the newest `n` dated logs that no rule was
written from and no model learned from (split `held_out` or `unread`),
newest by the day the log was posted. Neither training nor the rules'
calibration may read them: they are the newer logs a model trained on
older ones is tested on."""

CHRONO_TEST = 150
NEVER_READ = ("held_out", "unread")


def chrono_test(records, n=CHRONO_TEST):
    """The rows of the chronological held-out part, oldest first."""
    unseen = sorted((r for r in records if r.get("date") and r.get("split") in NEVER_READ),
                    key=lambda r: (r["date"], r["id"]))
    return unseen[-n:]
