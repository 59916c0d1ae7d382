"""Model helpers: the offline Qwen2.5 tokenizer (``easyrl.models.tokenizer``) and tiny test models (``.tiny``)."""
