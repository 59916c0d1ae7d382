"""An environment hook for the tests: asks for a second try once, then ends the episode."""


def second_try(messages: list[dict]):
    users = [m for m in messages if m["role"] == "user"]
    return None if users else "Try again."
