"""The input of both stacks of the Transformer of "Attention Is All You Need" (Vaswani et al., 2017):

- `VanillaTransformerScaledWordEmbedding`: token embeddings multiplied by sqrt(d_model), Section 3.4.
- `sinusoidal_position_encoding` / `VanillaTransformerPositionalEncoding`: the positional encodings of
  Section 3.5, or learned positions (Table 3, row E).

This module is copied next to saved weights for `trust_remote_code=True` users, so it imports the
package only relatively.
"""

import math

import torch
from torch import nn

from .configuration_vanilla_transformer import VanillaTransformerConfig


class VanillaTransformerScaledWordEmbedding(nn.Embedding):
    """Token embeddings multiplied by sqrt(d_model) (Section 3.4). The scale is part of the module, so
    `inputs_embeds` built with `get_input_embeddings()` (PEFT prompt tuning, `generate(inputs_embeds=)`)
    equal what the model makes from the same ids."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int, embed_scale: float) -> None:
        super().__init__(num_embeddings, embedding_dim, padding_idx)
        self.embed_scale = embed_scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) * self.embed_scale


def sinusoidal_position_encoding(
    num_positions: int, dim: int, layout: str = "paper", offset: int = 0
) -> torch.Tensor:
    """The positional encodings of Section 3.5, one row per position, computed in float64.

    PE(pos, 2i) = sin(pos / 10000^(2i / d_model)) and PE(pos, 2i + 1) = cos(pos / 10000^(2i / d_model)).
    `layout="marian"` puts the same sines in the first half and cosines in the second; `"fairseq"` does
    the same with fairseq's frequencies exp(-i ln(10000) / (d/2 - 1)). `offset` is the first position.
    """
    return _sinusoids(torch.arange(offset, offset + num_positions, dtype=torch.float64), dim, layout)


def _sinusoids(positions: torch.Tensor, dim: int, layout: str) -> torch.Tensor:
    """`sinusoidal_position_encoding` of the float64 `positions` (of any shape, the encodings along a new
    last dimension), on their device, as float32."""
    if layout == "fairseq":
        half = dim // 2
        exponents = torch.arange(half, dtype=torch.float64, device=positions.device)
        inverse_frequencies = torch.exp(exponents * -(math.log(10000) / (half - 1)))
    else:
        two_i = torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device)
        inverse_frequencies = 10000.0 ** (-two_i / dim)
    angles = positions[..., None] * inverse_frequencies
    if layout == "paper":
        # shape, not len(): under torch.export len() would fix the number of positions to the example's.
        table = torch.empty(*positions.shape, dim, dtype=torch.float64, device=positions.device)
        table[..., 0::2] = torch.sin(angles)
        table[..., 1::2] = torch.cos(angles)[..., : dim // 2]
    else:
        table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
    return table.float()


class VanillaTransformerPositionalEncoding(nn.Module):
    """Positions for the embeddings: the fixed sinusoids of Section 3.5, or learned ones (Table 3, row E).

    The sinusoid table is a computed, non-persistent buffer: nothing is saved, and `_init_weights`
    rebuilds it after `from_pretrained` builds the model on the meta device.
    """

    def __init__(self, config: VanillaTransformerConfig) -> None:
        super().__init__()
        self.learned = config.position_embedding_type == "learned"
        self.layout = config.sinusoidal_layout
        self.offset = config.pad_token_id + 1 if self.layout == "fairseq" else 0
        self.dim = config.d_model
        if self.learned:
            self.weight = nn.Parameter(torch.empty(config.max_position_embeddings, config.d_model))
        else:
            self.register_buffer(
                "weight", self.sinusoid_table(config.max_position_embeddings), persistent=False
            )

    def sinusoid_table(self, num_positions: int) -> torch.Tensor:
        return sinusoidal_position_encoding(num_positions, self.dim, self.layout, self.offset)

    def check_length(self, num_positions: int) -> None:
        """Refuse more positions than learned embeddings encode; the sinusoids extend to any length."""
        if self.learned and num_positions > self.weight.shape[0]:
            raise ValueError(
                f"Position {num_positions - 1} is past the {self.weight.shape[0]} learned position "
                "embeddings (max_position_embeddings). Truncate inputs, and a static cache's max_cache_len, "
                "to that many tokens, or use position_embedding_type='sinusoidal', whose table extends."
            )

    def forward(
        self, seq_length: int, cache_length: int | torch.Tensor = 0, left_padding: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The encodings of positions cache_length, ..., cache_length + seq_length - 1, of shape (seq_length,
        d_model); with `left_padding` (each sequence's count of padding tokens before its first token) one
        row of them per sequence, each counted from its first token. Lengths come from shapes; a static
        cache gives its length as a tensor, whose value is not read back from the device (the decoder
        checks the cache's capacity against learned positions instead)."""
        table = self.weight
        position_ids = torch.arange(seq_length, device=table.device) + cache_length
        if left_padding is not None:
            position_ids = (position_ids - left_padding.to(table.device)[:, None]).clamp_min(0)
        if isinstance(cache_length, int):
            self.check_length(cache_length + seq_length)
            if cache_length + seq_length > table.shape[0]:
                # The sinusoids are defined for every position, so longer inputs stay exact.
                table = self.sinusoid_table(cache_length + seq_length).to(
                    device=table.device, dtype=table.dtype
                )
        elif not self.learned:
            # Positions known only on the device may lie past the table: computed from the same formula.
            return _sinusoids(position_ids.double() + self.offset, self.dim, self.layout).to(table.dtype)
        return nn.functional.embedding(position_ids, table)


__all__ = [
    "VanillaTransformerPositionalEncoding",
    "VanillaTransformerScaledWordEmbedding",
    "sinusoidal_position_encoding",
]
