"""Checks of `generate()` for transformers' common test classes, where transformers' own
`GenerationTesterMixin` (tests/generation/test_utils.py, absent from its sdist) cannot be had.

`PaperGenerationChecks` covers what that mixin asks of an encoder-decoder model, each against an
independent truth rather than against `generate()` itself: greedy search against an argmax loop over the
model's full forward pass without a cache; the per-step logits, scores, attentions and hidden states of the
dictionary outputs against their shapes and a teacher-forced forward pass; beam search's sequence scores
against log-probabilities recomputed by forced decoding; sampling against greedy search (top-k 1) and
against itself (one seed); padded batches against each input alone; `inputs_embeds` against ids;
continuing from a returned cache, the static cache, assisted and prompt-lookup decoding against plain
greedy search; and the cache's layout. The test class supplies `model_tester` and
`all_generative_model_classes`, as for transformers' mixin.
"""

import copy

import torch
from transformers import GenerationMixin
from transformers.cache_utils import EncoderDecoderCache
from transformers.testing_utils import torch_device

from hf_vanilla_transformer.vanilla_transformer.modeling_vanilla_transformer import OUTPUT_CACHE_FIELD

NEW_TOKENS = 4


class PaperGenerationChecks:
    model_tester = None
    all_generative_model_classes = ()

    def _prepared(self, model_class: type, batch_size: int = 3, source_length: int = 5):
        """An eval-mode model of `model_class` and a batch of source ids with its attention mask."""
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        torch.manual_seed(0)
        model = model_class(config).to(torch_device).eval()
        input_ids = inputs["input_ids"][:batch_size, :source_length].to(torch_device)
        return model, input_ids, torch.ones_like(input_ids)

    @staticmethod
    def _start(model, batch_size: int) -> torch.Tensor:
        start = model.generation_config.decoder_start_token_id
        return torch.full((batch_size, 1), start, dtype=torch.long, device=torch_device)

    @torch.no_grad()
    def _argmax_loop(self, model, input_ids, attention_mask, steps: int) -> torch.Tensor:
        """Greedy decoding by hand: the whole target prefix through the model at every step, no cache, the
        end token kept out as `min_new_tokens` keeps it out."""
        decoded = self._start(model, input_ids.shape[0])
        for _ in range(steps):
            logits = model(
                input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoded, use_cache=False
            ).logits[:, -1]
            logits[:, model.config.eos_token_id] = -float("inf")
            decoded = torch.cat([decoded, logits.argmax(-1, keepdim=True)], dim=1)
        return decoded

    def _greedy(self, model, input_ids, attention_mask, **kwargs) -> torch.Tensor:
        """Greedy search for NEW_TOKENS tokens, the end token kept out; `kwargs` add to or change that."""
        options = dict(do_sample=False, num_beams=1, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
        return model.generate(input_ids, attention_mask=attention_mask, **(options | kwargs))

    def test_inherits_generation_mixin(self) -> None:
        for model_class in self.all_generative_model_classes:
            self.assertTrue(issubclass(model_class, GenerationMixin))

    def test_greedy_generate_matches_argmax_loop(self) -> None:
        for model_class in self.all_generative_model_classes:
            model, input_ids, attention_mask = self._prepared(model_class)
            for use_cache in (True, False):
                generated = self._greedy(model, input_ids, attention_mask, use_cache=use_cache)
                expected = self._argmax_loop(model, input_ids, attention_mask, NEW_TOKENS)
                self.assertTrue(torch.equal(generated, expected), f"use_cache={use_cache}")

    def test_greedy_generate_dict_outputs(self) -> None:
        for model_class in self.all_generative_model_classes:
            model, input_ids, attention_mask = self._prepared(model_class)
            model.set_attn_implementation("eager")  # SDPA computes no attention weights to return
            config = model.config
            batch_size, source_length = input_ids.shape
            for use_cache in (True, False):
                out = self._greedy(
                    model,
                    input_ids,
                    attention_mask,
                    use_cache=use_cache,
                    return_dict_in_generate=True,
                    output_scores=True,
                    output_logits=True,
                    output_attentions=True,
                    output_hidden_states=True,
                )
                self.assertEqual(out.sequences.shape, (batch_size, 1 + NEW_TOKENS))
                with torch.no_grad():
                    forced = model(
                        input_ids=input_ids,
                        attention_mask=attention_mask,
                        decoder_input_ids=out.sequences[:, :-1],
                        use_cache=False,
                    ).logits
                self.assertEqual(len(out.logits), NEW_TOKENS)
                self.assertEqual(len(out.scores), NEW_TOKENS)
                for step in range(NEW_TOKENS):
                    torch.testing.assert_close(out.logits[step], forced[:, step], atol=1e-5, rtol=1e-5)
                    # min_new_tokens keeps the end token out of every step's processed scores.
                    self.assertTrue(torch.isneginf(out.scores[step][:, config.eos_token_id]).all())
                    self.assertEqual(
                        out.scores[step].argmax(-1).tolist(), out.sequences[:, step + 1].tolist()
                    )

                heads, layers = config.decoder_attention_heads, config.decoder_layers
                self.assertEqual(len(out.encoder_attentions), config.encoder_layers)
                for attention in out.encoder_attentions:
                    self.assertEqual(
                        attention.shape,
                        (batch_size, config.encoder_attention_heads, source_length, source_length),
                    )
                self.assertEqual(len(out.encoder_hidden_states), config.encoder_layers + 1)
                for step in range(NEW_TOKENS):
                    # With a cache each step feeds one new token; without, the whole prefix.
                    queries, keys = (1 if use_cache else step + 1), step + 1
                    self.assertEqual(len(out.decoder_attentions[step]), layers)
                    self.assertEqual(len(out.cross_attentions[step]), layers)
                    self.assertEqual(len(out.decoder_hidden_states[step]), layers + 1)
                    for layer in range(layers):
                        self.assertEqual(
                            out.decoder_attentions[step][layer].shape, (batch_size, heads, queries, keys)
                        )
                        self.assertEqual(
                            out.cross_attentions[step][layer].shape,
                            (batch_size, heads, queries, source_length),
                        )
                    for hidden in out.decoder_hidden_states[step]:
                        self.assertEqual(hidden.shape, (batch_size, queries, config.d_model))

    def test_beam_search_scores_are_forced_decoding_log_probabilities(self) -> None:
        for model_class in self.all_generative_model_classes:
            model, input_ids, attention_mask = self._prepared(model_class)
            for use_cache in (True, False):
                out = model.generate(
                    input_ids,
                    attention_mask=attention_mask,
                    num_beams=3,
                    num_return_sequences=2,
                    max_new_tokens=NEW_TOKENS,
                    length_penalty=0.0,  # scores are then plain sums of log-probabilities
                    use_cache=use_cache,
                    return_dict_in_generate=True,
                    output_scores=True,
                )
                batch_size = input_ids.shape[0]
                self.assertEqual(out.sequences.shape[0], 2 * batch_size)
                self.assertLessEqual(out.sequences.shape[1], 1 + NEW_TOKENS)
                self.assertEqual(out.sequences_scores.shape, (2 * batch_size,))
                self.assertEqual(out.beam_indices.shape[0], 2 * batch_size)
                sources = input_ids.repeat_interleave(2, dim=0)
                with torch.no_grad():
                    logits = model(
                        input_ids=sources,
                        attention_mask=attention_mask.repeat_interleave(2, dim=0),
                        decoder_input_ids=out.sequences[:, :-1],
                        use_cache=False,
                    ).logits
                log_probs = logits.log_softmax(-1).gather(-1, out.sequences[:, 1:, None]).squeeze(-1)
                for row, tokens in enumerate(out.sequences[:, 1:].tolist()):
                    eos = model.config.eos_token_id
                    length = tokens.index(eos) + 1 if eos in tokens else len(tokens)
                    expected = log_probs[row, :length].sum()
                    torch.testing.assert_close(out.sequences_scores[row], expected, atol=1e-4, rtol=1e-4)
                # Each input's hypotheses come best first.
                pairs = out.sequences_scores.view(batch_size, 2)
                self.assertTrue((pairs[:, 0] >= pairs[:, 1]).all())

    @staticmethod
    def _sampled_twice(model, input_ids, attention_mask, **kwargs) -> list:
        """Two samplings, each from the same seed, of two sequences per input."""
        draws = []
        for _ in range(2):
            torch.manual_seed(7)
            draws.append(
                model.generate(
                    input_ids,
                    attention_mask=attention_mask,
                    do_sample=True,
                    num_return_sequences=2,
                    max_new_tokens=NEW_TOKENS,
                    return_dict_in_generate=True,
                    output_scores=True,
                    **kwargs,
                )
            )
        return draws

    def test_sample_generate(self) -> None:
        for model_class in self.all_generative_model_classes:
            model, input_ids, attention_mask = self._prepared(model_class)
            greedy = self._greedy(model, input_ids, attention_mask)
            top_one = self._greedy(model, input_ids, attention_mask, do_sample=True, top_k=1)
            self.assertTrue(torch.equal(greedy, top_one))
            first, second = self._sampled_twice(model, input_ids, attention_mask, temperature=1.5)
            self.assertEqual(first.sequences.shape[0], 2 * input_ids.shape[0])
            self.assertTrue(torch.equal(first.sequences, second.sequences))

    def test_beam_sample_generate(self) -> None:
        for model_class in self.all_generative_model_classes:
            model, input_ids, attention_mask = self._prepared(model_class)
            first, second = self._sampled_twice(model, input_ids, attention_mask, num_beams=2)
            self.assertEqual(first.sequences.shape[0], 2 * input_ids.shape[0])
            self.assertTrue(torch.equal(first.sequences, second.sequences))
            self.assertTrue(torch.isfinite(first.sequences_scores).all())

    def test_padded_batch_equals_each_input_alone(self) -> None:
        for model_class in self.all_generative_model_classes:
            model, input_ids, _ = self._prepared(model_class)
            pad = model.config.pad_token_id
            lengths = [5, 3, 4]
            for side in ("right", "left"):
                padded = torch.full_like(input_ids, pad)
                mask = torch.zeros_like(input_ids)
                for row, length in enumerate(lengths):
                    span = slice(0, length) if side == "right" else slice(input_ids.shape[1] - length, None)
                    padded[row, span] = input_ids[row, :length]
                    mask[row, span] = 1
                batched = self._greedy(model, padded, mask)
                for row, length in enumerate(lengths):
                    alone = input_ids[row : row + 1, :length]
                    expected = self._greedy(model, alone, torch.ones_like(alone))
                    self.assertTrue(
                        torch.equal(batched[row : row + 1], expected), f"{side} padding, row {row}"
                    )

    def test_generate_from_inputs_embeds(self) -> None:
        for model_class in self.all_generative_model_classes:
            model, input_ids, attention_mask = self._prepared(model_class)
            embeddings = model.get_input_embeddings()(input_ids)
            from_ids = self._greedy(model, input_ids, attention_mask)
            from_embeds = self._greedy(model, None, attention_mask, inputs_embeds=embeddings)
            self.assertTrue(torch.equal(from_ids, from_embeds))

    def test_generate_continue_from_returned_cache(self) -> None:
        for model_class in self.all_generative_model_classes:
            model, input_ids, attention_mask = self._prepared(model_class)
            whole = model.generate(
                input_ids,
                attention_mask=attention_mask,
                max_new_tokens=2 * NEW_TOKENS,
                min_new_tokens=2 * NEW_TOKENS,
            )
            first = self._greedy(model, input_ids, attention_mask, return_dict_in_generate=True)
            self.assertIsInstance(getattr(first, OUTPUT_CACHE_FIELD), EncoderDecoderCache)
            continued = model.generate(
                input_ids,
                attention_mask=attention_mask,
                decoder_input_ids=first.sequences,
                # A mask as long as the ids tells generate() that they hold the cached tokens too.
                decoder_attention_mask=torch.ones_like(first.sequences),
                # Under the name generate() takes it by in the installed release.
                **{OUTPUT_CACHE_FIELD: copy.deepcopy(getattr(first, OUTPUT_CACHE_FIELD))},
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
            )
            self.assertTrue(torch.equal(continued, whole))

    def test_static_cache_equals_dynamic_cache(self) -> None:
        for model_class in self.all_generative_model_classes:
            model, input_ids, attention_mask = self._prepared(model_class)
            for num_beams in (1, 2):
                dynamic, static = (
                    self._greedy(
                        model,
                        input_ids,
                        attention_mask,
                        num_beams=num_beams,
                        cache_implementation=implementation,
                    )
                    for implementation in (None, "static")
                )
                self.assertTrue(torch.equal(dynamic, static), f"num_beams={num_beams}")

    def test_assisted_and_prompt_lookup_decoding_match_greedy(self) -> None:
        for model_class in self.all_generative_model_classes:
            model, input_ids, attention_mask = self._prepared(model_class, batch_size=1)
            greedy = self._greedy(model, input_ids, attention_mask)
            assisted = self._greedy(model, input_ids, attention_mask, assistant_model=copy.deepcopy(model))
            self.assertTrue(torch.equal(greedy, assisted))
            lookup = self._greedy(model, input_ids, attention_mask, prompt_lookup_num_tokens=2)
            self.assertTrue(torch.equal(greedy, lookup))

    def test_cache_layout(self) -> None:
        for model_class in self.all_generative_model_classes:
            model, input_ids, attention_mask = self._prepared(model_class)
            config = model.config
            decoder_input_ids = torch.cat([self._start(model, input_ids.shape[0])] * 3, dim=1)
            with torch.no_grad():
                out = model(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    decoder_input_ids=decoder_input_ids,
                    use_cache=True,
                )
            cache = getattr(out, OUTPUT_CACHE_FIELD)
            self.assertIsInstance(cache, EncoderDecoderCache)
            self.assertEqual(cache.get_seq_length(), 3)
            d_k, d_v = config.decoder_head_dims
            heads = config.decoder_attention_heads
            batch_size, source_length = input_ids.shape
            for layers, length in (
                (cache.self_attention_cache.layers, 3),
                (cache.cross_attention_cache.layers, source_length),
            ):
                self.assertEqual(len(layers), config.decoder_layers)
                for layer in layers:
                    self.assertEqual(layer.keys.shape, (batch_size, heads, length, d_k))
                    self.assertEqual(layer.values.shape, (batch_size, heads, length, d_v))
