"""A test reward that varies between random responses (the math reward is 0 for all of them): the fraction of the
response's characters that are ASCII letters. Gives non-zero GRPO advantages, so the policy loss really trains."""


def compute_score(reward_inputs, scale=1.0):
    scores = []
    for item in reward_inputs:
        text = item["response"]
        letters = sum(ch.isascii() and ch.isalpha() for ch in text)
        scores.append({"overall": scale * letters / max(len(text), 1), "length": float(item["response_length"])})
    return scores
