"""A test reward that fails on purpose: raises on a response containing "boom", never returns on one containing
"hang", divides by zero on one containing "divide" (an exception other than ValueError), ends its process
(``os._exit``) on one containing "exit now", and otherwise scores the response's length. ``compute_score`` is the
batch form, ``score_one`` the sequential one."""

import os
import time


def score_one(item):
    if "boom" in item["response"]:
        raise ValueError("cannot parse the answer")
    if "divide" in item["response"]:
        return {"overall": 1 / 0}
    if "exit now" in item["response"]:
        os._exit(3)
    if "hang" in item["response"]:
        time.sleep(3600)
    return {"overall": float(len(item["response"])), "format": 1.0}


def compute_score(reward_inputs):
    return [score_one(item) for item in reward_inputs]
