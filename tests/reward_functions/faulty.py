"""A test reward that fails on purpose: raises on a response containing "boom", never returns on one containing
"hang", and otherwise scores the response's length. ``compute_score`` is the batch form, ``score_one`` the
sequential one."""

import time


def score_one(item):
    if "boom" in item["response"]:
        raise ValueError("cannot parse the answer")
    if "hang" in item["response"]:
        time.sleep(3600)
    return {"overall": float(len(item["response"])), "format": 1.0}


def compute_score(reward_inputs):
    return [score_one(item) for item in reward_inputs]
