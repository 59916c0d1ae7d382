"""A strict judge-verdict parser for tests/test_e2e_judge.py: a verdict that is exactly one number (surrounding white
space allowed) is that number; anything else (SmolLM2 often answers in words) is unparseable."""


def strict_number(verdict):
    try:
        return float(verdict.strip())
    except ValueError:
        return None
