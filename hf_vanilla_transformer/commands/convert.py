"""Convert a Marian (opus-mt) or fairseq Transformer checkpoint into this package's format.

    vanilla-transformer convert --from marian --src opus-mt-en-de/ --out converted-en-de/
    vanilla-transformer convert --from fairseq --src wmt16.en-de.joined-dict.transformer/model.pt \\
        --data-dir wmt16.en-de.joined-dict.transformer/ --out converted-big/ \\
        [--source-lang en --target-lang de] [--bpe-codes FILE]

The output is a save_pretrained folder (safetensors, config, generation config, tokenizer) that
AutoModelForSeq2SeqLM and AutoTokenizer load after `hf_vanilla_transformer.register_auto_classes()`, or with
trust_remote_code=True. The summary printed at the end lists every key mapping and what the tokenizer does
and does not do; read it. docs/converting.md has the details.
"""

import argparse
from pathlib import Path

from ..common.cli import ArgumentParser, check_writable, run_command


def build_parser(prog: str | None = None) -> ArgumentParser:
    parser = ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument(
        "--from",
        dest="kind",
        choices=["marian", "fairseq"],
        required=True,
        help="the implementation that wrote the checkpoint",
    )
    parser.add_argument(
        "--src", type=Path, required=True, help="Marian model folder, or fairseq checkpoint file (.pt)"
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--force", action="store_true", help="write into --out even if it holds files")
    parser.add_argument("--data-dir", type=Path, help="fairseq: folder with dict.<lang>.txt (and bpecodes)")
    parser.add_argument(
        "--source-lang", help="fairseq: source language, if the checkpoint does not record it"
    )
    parser.add_argument(
        "--target-lang", help="fairseq: target language, if the checkpoint does not record it"
    )
    parser.add_argument(
        "--bpe-codes",
        type=Path,
        help="fairseq: BPE codes (or SentencePiece model) to copy next to the model, as bpecodes (or "
        "sentencepiece.bpe.model) (default: the first of DATA_DIR/bpecodes, code, sentencepiece.bpe.model)",
    )
    return parser


def run(args: argparse.Namespace, parser: ArgumentParser) -> int:
    """Convert the checkpoint and print the conversion report. A checkpoint that cannot be converted is
    refused like any bad argument: one line, exit status 2."""
    fairseq_options = {"--data-dir": args.data_dir, "--source-lang": args.source_lang}
    fairseq_options |= {"--target-lang": args.target_lang, "--bpe-codes": args.bpe_codes}
    misplaced = [flag for flag, value in fairseq_options.items() if value is not None]
    if args.kind == "fairseq" and args.data_dir is None:
        parser.error("--from fairseq needs --data-dir (the folder with dict.<lang>.txt).")
    if args.kind == "marian" and misplaced:
        parser.error(f"{', '.join(misplaced)}: for --from fairseq only.")
    if args.src.resolve() == args.out.resolve():
        parser.error("--out must differ from --src.")
    wanted = "Marian model folder" if args.kind == "marian" else "fairseq checkpoint file (.pt)"
    if not args.src.exists():
        parser.error(f"--src {args.src}: no such file or folder; give the {wanted}.")
    if args.data_dir is not None and not args.data_dir.is_dir():
        parser.error(f"--data-dir {args.data_dir}: no such folder; give the folder with dict.<lang>.txt.")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} is a file: give a folder.")
    if args.out.is_dir() and any(args.out.iterdir()) and not args.force:
        parser.error(f"--out {args.out} is not empty: give a new folder, or --force to write into it.")
    check_writable(args.out, "--out", parser)

    from ..conversion import ConversionError, convert_fairseq_checkpoint, convert_marian_folder

    try:
        if args.kind == "marian":
            report = convert_marian_folder(args.src, args.out)
        else:
            report = convert_fairseq_checkpoint(
                args.src, args.data_dir, args.out, args.source_lang, args.target_lang, args.bpe_codes
            )
    except ConversionError as error:
        parser.error(str(error))
    print(report.format())
    return 0


def main(argv: list[str] | None = None) -> int | None:
    """`vanilla-transformer convert ARGV`."""
    return run_command(run, build_parser(), argv)
