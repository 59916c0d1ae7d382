"""A test reward for dynamic sampling: problems whose answer has an even CRC32 (5 of the 10 Geometry3K sample
problems) get the same score for every response, so their groups carry no signal and must be dropped; the others are
scored like ``letters.py`` (varies between responses)."""

import zlib


def compute_score(reward_inputs):
    scores = []
    for item in reward_inputs:
        text = item["response"]
        if zlib.crc32(item["ground_truth"].encode()) % 2 == 0:
            overall = 0.5
        else:
            overall = sum(ch.isascii() and ch.isalpha() for ch in text) / max(len(text), 1)
        scores.append({"overall": overall})
    return scores
