"""An example tool that returns an image, for Qwen-VL models (docs/agents.md, "Tool images"): a zoom into an image
file. A tool returns images as verl's ``ToolResponse`` carries them, ``{"text": ..., "image": [PIL images]}``
(or a bare ``PIL.Image``); the next turn shows them to the model.

    worker.rollout.multi_turn.tools=[examples/agents/image_tools.py:zoom]
    worker.rollout.limit_images=4        # the prompt's images + the tool images of one conversation
"""

from PIL import Image


def zoom(path: str, left: float, top: float, right: float, bottom: float) -> dict:
    """Zoom into a region of an image file.

    Args:
        path: the image file.
        left: the region's left edge, as a fraction of the width (0 to 1).
        top: the region's top edge, as a fraction of the height (0 to 1).
        right: the region's right edge, as a fraction of the width (0 to 1).
        bottom: the region's bottom edge, as a fraction of the height (0 to 1).
    """
    if not (0 <= left < right <= 1 and 0 <= top < bottom <= 1):
        raise ValueError("need 0 <= left < right <= 1 and 0 <= top < bottom <= 1")
    with Image.open(path) as image:
        w, h = image.size
        crop = image.convert("RGB").crop((round(left * w), round(top * h), round(right * w), round(bottom * h)))
    return {"text": f"zoomed into {crop.width}x{crop.height} pixels of {path}", "image": [crop]}
