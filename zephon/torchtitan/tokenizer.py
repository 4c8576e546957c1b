"""TorchTitan's tokenizer slot, filled with the recipe's tokenizer, so both agree."""

from __future__ import annotations

from dataclasses import dataclass

from torchtitan.components.tokenizer import BaseTokenizer

from zephon.io.tokenizer import load_tokenizer


class ZephonTokenizer(BaseTokenizer):
    @dataclass(kw_only=True, slots=True)
    class Config(BaseTokenizer.Config):
        tokenizer_id: str = ""
        """A tokenizer.json or its folder, a Hugging Face id, or tiktoken:NAME."""

    def __init__(self, config: Config, *, tokenizer_path: str | None = None, **kwargs):
        super().__init__()
        self.tokenizer = load_tokenizer(config.tokenizer_id)
        self.eos_id = self.tokenizer.eos_id
        self.bos_id = self.tokenizer.bos_id

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = self.tokenizer.encode_batch([text])[0]
        head = [self.bos_id] if add_bos and self.bos_id is not None else []
        tail = [self.eos_id] if add_eos and self.eos_id is not None else []
        return head + ids + tail

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def get_vocab_size(self) -> int:
        return self.tokenizer.vocab_size
