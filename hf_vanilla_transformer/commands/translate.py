"""Translate text with a trained or published model, one sentence per line.

    echo "A dog runs in the park." | vanilla-transformer translate --model runs/demo/model
    vanilla-transformer translate --model org/name --input test.en --output test.hyp.de --device cuda
    vanilla-transformer translate --model runs/demo/ct2 --engine ctranslate2 --input test.en   # an export
    vanilla-transformer translate --model runs/demo/ct2 --device cuda --compute-type int8_float16 < test.en

    vanilla-transformer translate --model runs/demo/model --n-best 4 --output-format jsonl < test.en
    vanilla-transformer translate --model runs/demo/model --split-sentences --alignments < paragraphs.en
    vanilla-transformer translate --model runs/reverse/model --sampling-topk 10 --seed 1 < mono.de

Decoding follows the model's generation config (for this package's models, the paper's: beam 4, GNMT
length penalty 0.6, output up to input length + 50); the flags override it. Every input line gives one
output line (text), one line per hypothesis (tsv) or one JSON object (jsonl); an empty input line gives an
empty translation. Input is read and written in chunks, in order: a file of any length in flat memory, and
a pipe answered line by line as it arrives.
"""

import argparse
import io
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import BinaryIO, TextIO

from ..common.cli import (
    STANDARD_STREAM,
    ArgumentParser,
    check_writable,
    finite_float,
    non_negative_int,
    positive_float,
    positive_int,
    probability,
    refusals_in_one_line,
    run_command,
)
from ..common.text_lines import NotUTF8Error, arriving_chunks, count_lines
from ..inference import sentence_splitting
from ..inference.hypotheses import OUTPUT_FORMATS, format_translation
from ..inference.sentence_splitting import SPLITTER_LANGUAGES
from .engine_options import add_engine_arguments, command_engine, load_command_translator

# Lines translated at a time: sorted by length within a chunk, written in input order after it.
CHUNK_LINES = 10_000


def _open(path: str, mode: str, stream: TextIO) -> nullcontext[TextIO] | TextIO:
    """The file at `path`, or the standard `stream` for "-", which is left open for the caller."""
    return nullcontext(stream) if path == STANDARD_STREAM else open(path, mode, encoding="utf-8")


def build_parser(prog: str | None = None) -> ArgumentParser:
    parser = ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("--model", required=True, help="model folder or Hub id")
    parser.add_argument("--input", default=STANDARD_STREAM, help="file to translate ('-': standard input)")
    parser.add_argument(
        "--output", default=STANDARD_STREAM, help="where to write translations ('-': standard output)"
    )
    parser.add_argument("--batch-size", type=positive_int, default=64, help="sentences per generate() call")
    parser.add_argument(
        "--num-beams", type=positive_int, help="beam size; 1 is greedy (default: the model's)"
    )
    parser.add_argument(
        "--length-penalty", type=finite_float, help="alpha of the length penalty (default: the model's)"
    )
    parser.add_argument(
        "--length-penalty-type",
        choices=("gnmt", "transformers"),
        help="gnmt: ((5 + |Y|) / 6)^alpha, transformers: |Y|^alpha (default: the model's)",
    )
    parser.add_argument(
        "--max-length-offset",
        type=non_negative_int,
        help="outputs at most this many tokens longer than their input (default: the model's)",
    )
    add_engine_arguments(parser, "decodes", runtime=True)
    output = parser.add_argument_group("what is written")
    output.add_argument(
        "--n-best",
        type=positive_int,
        default=1,
        help="hypotheses written per input, best first (at most the beam)",
    )
    output.add_argument(
        "--output-format",
        choices=OUTPUT_FORMATS,
        help="text: the best translation a line; tsv: 'index ||| hypothesis ||| score ||| log_prob' a "
        "hypothesis (Moses n-best); jsonl: one object a line with translations [{text, score, log_prob, "
        "tokens}] (default: text, tsv with --n-best above 1)",
    )
    output.add_argument(
        "--alignments",
        action="store_true",
        help="add source-target word alignments in Pharaoh format ('0-0 1-2', source-target word indices), "
        "from the cross-attention",
    )
    output.add_argument(
        "--split-sentences",
        action="store_true",
        help="split each line into sentences (pysbd), translate them, and join them back into one line",
    )
    output.add_argument(
        "--language",
        choices=SPLITTER_LANGUAGES,
        default="en",
        help="the input's language, for --split-sentences",
    )
    output.add_argument(
        "--max-wait-ms",
        type=non_negative_int,
        default=100,
        help="on a pipe, translate the lines that have arrived once this many milliseconds pass without "
        "a new one",
    )
    sampling = parser.add_argument_group(
        "sampling (back-translation): any of these samples instead of the beam"
    )
    sampling.add_argument(
        "--sampling-topk", type=non_negative_int, help="sample among the K likeliest tokens (0: all)"
    )
    sampling.add_argument(
        "--sampling-topp", type=probability, help="sample among the likeliest tokens of total probability P"
    )
    sampling.add_argument("--temperature", type=positive_float, help="divide the logits by T before sampling")
    sampling.add_argument("--seed", type=non_negative_int, default=0, help="random seed of the sampling")
    return parser


def _check_output(args: argparse.Namespace, parser: ArgumentParser) -> None:
    """Refuse an --output that cannot take the translations, before the model loads."""
    if args.output == STANDARD_STREAM:
        return
    output = Path(args.output)
    if output.is_dir():
        parser.error(f"--output {args.output} is a folder: give a file name for the translations.")
    if not output.resolve().parent.is_dir():
        parser.error(f"--output {args.output}: its folder does not exist; create it first.")
    check_writable(args.output, "--output", parser, kind="file")
    if args.input != STANDARD_STREAM and output.resolve() == Path(args.input).resolve():
        parser.error(
            f"--output {args.output} is also --input: the translations would replace the text; "
            "give another file."
        )
    existed = output.exists()
    try:  # appending changes nothing, and meets what refuses writes: /proc files, read-only mounts
        output.open("a", encoding="utf-8").close()
    except OSError as error:
        parser.error(f"--output {args.output}: cannot write there ({error.strerror}); give a regular file.")
    if not existed:
        output.unlink()


def _decoding(args: argparse.Namespace, parser: ArgumentParser) -> tuple[dict, str]:
    """The generate() overrides the flags ask for, and the output format; one-line errors for flags that
    contradict each other."""
    sampling = {
        "top_k": args.sampling_topk,
        "top_p": args.sampling_topp,
        "temperature": args.temperature,
    }
    sampled = any(value is not None for value in sampling.values())
    if sampled and args.num_beams not in (None, 1):
        parser.error(
            "sampling draws one output token at a time: leave out --num-beams, or the sampling flags."
        )
    overrides = {
        "num_beams": 1 if sampled else args.num_beams,
        "length_penalty": args.length_penalty,
        "length_penalty_type": args.length_penalty_type,
        "max_length_offset": args.max_length_offset,
    }
    if sampled:
        overrides.update(do_sample=True, top_k=args.sampling_topk or 0, top_p=args.sampling_topp or 1.0)
        overrides["temperature"] = args.temperature or 1.0
    output_format = args.output_format or ("tsv" if args.n_best > 1 else "text")
    if output_format == "text" and args.n_best > 1:
        parser.error(
            f"--n-best {args.n_best} with --output-format text: text has one translation a line; "
            "write the n best with --output-format tsv or jsonl."
        )
    if args.split_sentences:
        with refusals_in_one_line(parser):
            sentence_splitting.check_n_best(args.n_best)
    return {key: value for key, value in overrides.items() if value is not None}, output_format


def _input_stream(args: argparse.Namespace, parser: ArgumentParser) -> tuple[BinaryIO, int | None]:
    """The input as bytes, and its number of lines where it is a file (checked to be UTF-8 first, so that
    a file the command cannot read is refused before the model loads)."""
    if args.input == STANDARD_STREAM:
        return getattr(sys.stdin, "buffer", None) or _encoded(sys.stdin), None
    path = Path(args.input)
    if path.is_dir():
        parser.error(f"--input {args.input} is a folder: give a text file with one sentence a line.")
    if not path.is_file():
        parser.error(f"--input {args.input}: no such file; give a text file with one sentence a line.")
    try:
        total = count_lines(path)
    except NotUTF8Error as error:
        parser.error(f"--input {error}")
    return path.open("rb"), total


def _encoded(stream: TextIO) -> BinaryIO:
    """A text stream without bytes underneath (io.StringIO) as UTF-8 bytes."""
    return io.BytesIO(stream.read().encode("utf-8"))


def run(args: argparse.Namespace, parser: ArgumentParser) -> None:
    """Translate `args.input` into `args.output`, chunk by chunk and in input order."""
    _check_output(args, parser)
    overrides, output_format = _decoding(args, parser)
    engine = command_engine(args, parser)
    if args.alignments and not engine.alignments:
        parser.error(
            f"--alignments: the {engine.title} engine gives no attention to align with; translate with the "
            "torch or ctranslate2 engine."
        )
    # Imported where a translation runs, so that `--help` and argument errors answer without torch.
    from tqdm.auto import tqdm

    from ..inference.translation import seed_sampling

    source, total = _input_stream(args, parser)
    translator = load_command_translator(args, parser, engine)
    if "do_sample" in overrides:
        seed_sampling(args.seed)
    scores = output_format != "text"
    name = "standard input" if args.input == STANDARD_STREAM else args.input
    # A file's bar counts up to its lines; a stream's counts the lines done, where someone watches.
    bar = tqdm(
        total=total, desc="Translating", unit="line", disable=total is None and not sys.stderr.isatty()
    )
    # The refusal is outermost: the bar closes first whatever ends the run, so that an error's line is the
    # last on standard error.
    with refusals_in_one_line(parser), bar, source, _open(args.output, "w", sys.stdout) as target:
        chunks = arriving_chunks(source, name, CHUNK_LINES, args.max_wait_ms / 1000)
        try:
            for first, lines in chunks:
                translations = translator.translate_n_best(
                    lines,
                    n_best=args.n_best,
                    scores=scores,
                    alignments=args.alignments,
                    split_sentences=args.split_sentences,
                    language=args.language,
                    batch_size=args.batch_size,
                    first_line=first,
                    **overrides,
                )
                for offset, translation in enumerate(translations):
                    target.write(format_translation(translation, first - 1 + offset, output_format))
                target.flush()
                bar.update(len(lines))
        except NotUTF8Error as error:
            raise ValueError(f"--input {error} The lines before it were translated.") from None


def main(argv: list[str] | None = None) -> int | None:
    """`vanilla-transformer translate ARGV`."""
    return run_command(run, build_parser(), argv)
