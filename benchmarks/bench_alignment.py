"""Which encoder-decoder attention aligns words best: each decoder layer (its heads averaged), each single
head, and the mean of all layers, measured on Multi30k test against an independent statistical aligner.

    python benchmarks/bench_alignment.py --model runs/demo/model

No hand-made gold alignments of Multi30k exist, so the reference is eflomal (Östling and Tiedemann, 2016;
`pip install eflomal`), a Bayesian IBM-model aligner with an HMM and fertility, trained on Multi30k train
and test together (30,000 pairs), in both directions. Words are split at whitespace, as
`hf_vanilla_transformer.inference.alignment` splits them; eflomal sees them lowercased and without the
punctuation at their edges ("man." as "man"), which keeps their number and position but stops "man" and "man."
from being different words to it. The two directions are symmetrized with grow-diag-final-and (Koehn et
al., 2005) into the reference R, and by intersection into its sure part S. Reported per attention rule,
summed over the test set: precision |A & R| / |A|, recall |A & R| / |R|, F1, and the alignment error
rate AER = 1 - (|A & S| + |A & R|) / (|A| + |S|) (Och and Ney, 2003, with R as the possible links).

Each rule is measured on two target sides: the test set's reference German translations, force-decoded
by the model given their English sources, and (unless --no-own) the model's own translations
(`translation.translate`, its beam search), which eflomal then aligns in a second run. And two row
conventions: the attention of the step that produced a target token ("produced", the rule of
`alignment.align`), and of the next step, where that token is the decoder's input ("input", the shift
some attention aligners use). A diagonal baseline (target word j to source word round(j x |src| /
|tgt|)) gives the scale.
"""

import argparse
import importlib.util
import re
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPOSITORY, machine_line, write_result  # noqa: E402

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration  # noqa: E402
from hf_vanilla_transformer.inference.alignment import cross_attention_heads, pharaoh, word_attention  # noqa: E402
from hf_vanilla_transformer.inference.translation import translate  # noqa: E402

Links = set[tuple[int, int]]
NEIGHBOURS = [(-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)]
_EDGE_PUNCTUATION = re.compile(r"^\W+|\W+$")


def aligner_words(line: str) -> str:
    """The line as eflomal sees it: the same whitespace words, lowercased, edge punctuation dropped (a
    word of punctuation only stays as it is)."""
    return " ".join(_EDGE_PUNCTUATION.sub("", word.lower()) or word for word in line.split())


def read_links(path: Path) -> list[Links]:
    return [
        {(int(i), int(j)) for i, j in (pair.split("-") for pair in line.split())}
        for line in path.read_text().splitlines()
    ]


def eflomal_links(sources: list[str], targets: list[str]) -> tuple[list[Links], list[Links]]:
    """eflomal's forward and reverse links ("i-j", source i, target j) for every pair."""
    import eflomal

    with tempfile.TemporaryDirectory() as folder:
        forward, reverse = Path(folder) / "forward", Path(folder) / "reverse"
        eflomal.Aligner().align(
            [aligner_words(line) for line in sources],
            [aligner_words(line) for line in targets],
            links_filename_fwd=str(forward),
            links_filename_rev=str(reverse),
            quiet=True,
        )
        return read_links(forward), read_links(reverse)


def grow_diag_final_and(forward: Links, reverse: Links) -> Links:
    """Koehn et al. (2005)'s symmetrization: the intersection, grown by neighbouring (diagonals included)
    union links that align a word not yet aligned, then the links of each direction whose two words are
    both still unaligned."""
    alignment, union = forward & reverse, forward | reverse
    grown = True
    while grown:
        grown = False
        for i, j in sorted(alignment):
            for di, dj in NEIGHBOURS:
                link = (i + di, j + dj)
                if link in union and link not in alignment:
                    sources, targets = {a for a, _ in alignment}, {b for _, b in alignment}
                    if link[0] not in sources or link[1] not in targets:
                        alignment.add(link)
                        grown = True
    for direction in (forward, reverse):
        for i, j in sorted(direction):
            if i not in {a for a, _ in alignment} and j not in {b for _, b in alignment}:
                alignment.add((i, j))
    return alignment


def parse_pharaoh(text: str) -> Links:
    return {(int(i), int(j)) for i, j in (pair.split("-") for pair in text.split())}


class Scores:
    """Link counts summed over sentences, per rule."""

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}

    def add(self, rule: str, hypothesis: Links, reference: Links, sure: Links) -> None:
        counts = self.counts.setdefault(rule, [0, 0, 0, 0, 0])
        for k, value in enumerate(
            (len(hypothesis), len(reference), len(sure), len(hypothesis & reference), len(hypothesis & sure))
        ):
            counts[k] += value

    def table(self) -> dict[str, dict[str, float]]:
        results = {}
        for rule, (a, r, s, a_r, a_s) in self.counts.items():
            precision, recall = a_r / a, a_r / r
            results[rule] = {
                "precision": round(precision, 4),
                "recall": round(recall, 4),
                "f1": round(2 * precision * recall / (precision + recall), 4),
                "aer": round(1 - (a_s + a_r) / (a + s), 4),
            }
        return results


def rules_of(attention: torch.Tensor) -> tuple[list[str], torch.Tensor]:
    """The attention rules measured, from [layers, heads, target, source] weights: each layer's head mean,
    each single head, the mean over all layers; their names and their [rules, target, source] weights."""
    layers, heads = attention.shape[:2]
    names, matrices = [], []
    for layer in range(layers):
        names.append(f"layer {layer + 1}")
        matrices.append(attention[layer].mean(dim=0))
        for head in range(heads):
            names.append(f"layer {layer + 1} head {head + 1}")
            matrices.append(attention[layer, head])
    names.append("all layers")
    matrices.append(attention.mean(dim=(0, 1)))
    return names, torch.stack(matrices)


def measure(
    model: VanillaTransformerForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    sources: list[str],
    targets: list[str],
    reference: list[Links],
    sure: list[Links],
    batch_size: int,
) -> dict[str, dict[str, float]]:
    """Force-decode each target given its source and score every rule's links against the reference."""
    scores = Scores()
    layers = list(range(model.config.decoder_layers))
    start = model.config.decoder_start_token_id
    for begin in range(0, len(sources), batch_size):
        source_ids = tokenizer(sources[begin : begin + batch_size])["input_ids"]
        target_ids = tokenizer(targets[begin : begin + batch_size])["input_ids"]
        inputs = tokenizer.pad({"input_ids": source_ids}, return_tensors="pt")
        width = max(len(ids) for ids in target_ids) + 1
        sequences = torch.tensor(
            [[start, *ids] + [model.config.pad_token_id] * (width - 1 - len(ids)) for ids in target_ids]
        )
        attention = cross_attention_heads(
            model, inputs["input_ids"], inputs["attention_mask"], sequences, layers
        )
        for row, (source, target) in enumerate(zip(source_ids, target_ids)):
            k = begin + row
            per_row = attention[:, row]
            # "input": the step after the one that produced target token t, whose decoder input it is.
            for convention, rows, ids in (
                ("produced", per_row, target),
                ("input", per_row[..., 1:, :], target[:-1]),
            ):
                names, matrices = rules_of(rows)
                source_words, target_words, weights = word_attention(matrices, source, ids, tokenizer)
                for rule, matrix in zip(names, weights):
                    scores.add(f"{rule}, {convention}", parse_pharaoh(pharaoh(matrix)), reference[k], sure[k])
            diagonal = {
                (min(len(source_words) - 1, round(j * len(source_words) / len(target_words))), j)
                for j in range(len(target_words))
            }
            scores.add("diagonal", diagonal, reference[k], sure[k])
    return scores.table()


def references(
    train: tuple[list[str], list[str]], sources: list[str], targets: list[str]
) -> tuple[list[Links], list[Links]]:
    """eflomal on train + the test pairs: the test pairs' grow-diag-final-and links and intersection links."""
    forward, reverse = eflomal_links(train[0] + sources, train[1] + targets)
    test = range(len(train[0]), len(train[0]) + len(sources))
    return [grow_diag_final_and(forward[k], reverse[k]) for k in test], [
        forward[k] & reverse[k] for k in test
    ]


def plot(results: dict, path: Path) -> None:
    """F1 by decoder layer: head means for both row conventions, single heads as dots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scores = results["reference_translations"]
    layers = results["decoder_layers"]
    figure, axis = plt.subplots(figsize=(6, 4))
    x = list(range(1, layers + 1))
    for convention, style in (("produced", "o-"), ("input", "s--")):
        axis.plot(
            x, [scores[f"layer {n}, {convention}"]["f1"] for n in x], style, label=f"head mean, {convention}"
        )
    heads = [
        (n, scores[f"layer {n} head {h}, produced"]["f1"]) for n in x for h in range(1, results["heads"] + 1)
    ]
    axis.scatter(
        [n + 0.08 for n, _ in heads], [f1 for _, f1 in heads], s=14, c="grey", label="single heads, produced"
    )
    axis.axhline(
        scores["diagonal"]["f1"], color="grey", linewidth=0.8, linestyle=":", label="diagonal baseline"
    )
    axis.set_xticks(x)
    axis.set_xlabel("decoder layer")
    axis.set_ylabel("F1 against eflomal (grow-diag-final-and)")
    axis.set_title("Word alignment from encoder-decoder attention, Multi30k test", fontsize=10)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=150)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=str(REPOSITORY / "runs" / "demo" / "model"))
    parser.add_argument("--data", default=str(REPOSITORY / "data" / "multi30k"))
    parser.add_argument("--sentences", type=int, default=1000, help="test pairs measured (from the start)")
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-own", action="store_true", help="skip the model's own translations")
    parser.add_argument(
        "--output", default=str(REPOSITORY / "benchmarks" / "results" / "results_alignment.json")
    )
    parser.add_argument("--figure", default=str(REPOSITORY / "docs" / "figures" / "alignment_layers.png"))
    args = parser.parse_args(argv)
    if importlib.util.find_spec("eflomal") is None:
        parser.error("the reference aligner eflomal is not installed: pip install eflomal")
    torch.set_num_threads(args.threads)
    data = Path(args.data)

    def read(name: str) -> list[str]:
        return (data / name).read_text(encoding="utf-8").splitlines()

    train = (read("train.en"), read("train.de"))
    sources = read("test_2016_flickr.en")[: args.sentences]
    targets = read("test_2016_flickr.de")[: args.sentences]
    model = VanillaTransformerForConditionalGeneration.from_pretrained(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    seconds: dict[str, float] = {}

    began = time.perf_counter()
    reference, sure = references(train, sources, targets)
    seconds["eflomal, reference translations"] = time.perf_counter() - began
    began = time.perf_counter()
    results = {
        "command": "python benchmarks/bench_alignment.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine_line(),
        "model": args.model,
        "decoder_layers": model.config.decoder_layers,
        "heads": model.config.decoder_attention_heads,
        "sentences": len(sources),
        "reference_links": sum(map(len, reference)),
        "reference_translations": measure(model, tokenizer, sources, targets, reference, sure, args.batch),
    }
    seconds["forced decoding and scoring, reference translations"] = time.perf_counter() - began
    if not args.no_own:
        began = time.perf_counter()
        own = translate(model, tokenizer, sources, progress=False)
        seconds["translating (beam search)"] = time.perf_counter() - began
        began = time.perf_counter()
        own_reference, own_sure = references(train, sources, own)
        seconds["eflomal, own translations"] = time.perf_counter() - began
        began = time.perf_counter()
        results["own_translations"] = measure(
            model, tokenizer, sources, own, own_reference, own_sure, args.batch
        )
        seconds["forced decoding and scoring, own translations"] = time.perf_counter() - began
    results["seconds"] = {key: round(value, 1) for key, value in seconds.items()}
    write_result(results, args.output)
    table = results["reference_translations"]
    for rule in sorted(table, key=lambda name: -table[name]["f1"])[:12]:
        print(f"{rule:32s} {table[rule]}")
    if args.figure:
        plot(results, Path(args.figure))


if __name__ == "__main__":
    main()
