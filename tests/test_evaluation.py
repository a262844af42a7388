"""BLEU (Section 6.1): detokenized sacreBLEU (the package's `evaluate` metric), paper-style tokenized BLEU
with ##AT## splitting; chrF, chrF++ and TER against sacreBLEU's own objects; the CLI."""

import json
import os
import shutil
import subprocess
from functools import partial
from pathlib import Path

import evaluate
import pytest
import sacrebleu
from sacrebleu.metrics import BLEU, CHRF, TER

from hf_vanilla_transformer.commands import command_module
from hf_vanilla_transformer.evaluation.metrics import (
    SACREBLEU_METRIC,
    BleuResult,
    MetricResult,
    corpus_bleu,
    corpus_chrf,
    corpus_ter,
    split_compounds,
    tokenized_bleu,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
MULTI30K = REPO_ROOT / "data" / "multi30k"
REFERENCES = (MULTI30K / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()

# By hand, one segment, 6 tokens each, no brevity penalty: clipped n-gram matches are 5/6, 3/5, 2/4 and 1/3,
# so BLEU = 100 * (5/6 * 3/5 * 2/4 * 1/3) ** (1/4) = 100 * (1/12) ** (1/4).
CAT_HYP, CAT_REF = "the cat sat on the mat", "the cat sat on a mat"
CAT_BLEU = 100 * (1 / 12) ** 0.25

# A compound that is half right. Without splitting: 6 tokens, matches 5/6, 3/5, 2/4, 1/3 -> (1/12)^(1/4).
# Split, "schwarz-grauer" becomes "schwarz ##AT##-##AT## grauer": 8 tokens, matches 7/8, 5/7, 3/6, 1/5,
# so BLEU = 100 * (1/16) ** (1/4) = 50 exactly.
COMPOUND_HYP = "ein schwarz-grauer Hund läuft im Schnee"
COMPOUND_REF = "ein schwarz-weißer Hund läuft im Schnee"


def _degraded(lines: list[str]) -> list[str]:
    """Plausible imperfect output: drop every third segment's last word, swap words in every fifth."""
    out = []
    for i, line in enumerate(lines):
        words = line.split()
        if i % 3 == 0 and len(words) > 2:
            words = words[:-2] + words[-1:]
        if i % 5 == 0 and len(words) > 3:
            words[1], words[2] = words[2], words[1]
        out.append(" ".join(words))
    return out


def test_identical_text_scores_100():
    result = corpus_bleu(REFERENCES, REFERENCES)
    assert isinstance(result, BleuResult)
    assert result.score == pytest.approx(100.0)
    assert result.brevity_penalty == pytest.approx(1.0)
    assert result.signature == f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{sacrebleu.__version__}"
    assert tokenized_bleu(REFERENCES, REFERENCES).score == pytest.approx(100.0)


def test_hand_computed_example():
    assert corpus_bleu([CAT_HYP], [CAT_REF]).score == pytest.approx(CAT_BLEU)
    result = tokenized_bleu([CAT_HYP], [CAT_REF], compound_split=False)
    assert result.score == pytest.approx(CAT_BLEU)
    assert result.precisions == pytest.approx((100 * 5 / 6, 100 * 3 / 5, 100 * 2 / 4, 100 * 1 / 3))
    assert (result.hyp_len, result.ref_len) == (6, 6)


@pytest.mark.parametrize("tokenize", ["13a", "intl"])
def test_matches_sacrebleu_on_multi30k(tokenize):
    """corpus_bleu goes through the package's `evaluate` metric; scores and signatures are sacreBLEU's own."""
    hypotheses = _degraded(REFERENCES)
    bleu = BLEU(tokenize=tokenize)
    expected = bleu.corpus_score(hypotheses, [REFERENCES])
    result = corpus_bleu(hypotheses, REFERENCES, tokenize=tokenize)
    assert result.score == expected.score
    assert 20 < result.score < 100
    assert result.signature == str(bleu.get_signature())
    assert result.precisions == tuple(expected.precisions) and result.brevity_penalty == expected.bp
    assert (result.hyp_len, result.ref_len) == (expected.sys_len, expected.ref_len)


def _recased(lines: list[str]) -> list[str]:
    """The same words with the case of every other segment's first three words flipped."""
    return [
        " ".join(word.swapcase() if i % 2 == 0 and j < 3 else word for j, word in enumerate(line.split()))
        for i, line in enumerate(lines)
    ]


@pytest.mark.parametrize("score", [corpus_bleu, tokenized_bleu])
def test_lowercase_scores_the_lowercased_text(score):
    """Case-insensitive BLEU is exactly case-sensitive BLEU of both sides lowercased, and says so."""
    hypotheses = _recased(_degraded(REFERENCES))
    insensitive = score(hypotheses, REFERENCES, lowercase=True)
    lowered = score([line.lower() for line in hypotheses], [line.lower() for line in REFERENCES])
    assert insensitive.score == lowered.score
    assert (insensitive.hyp_len, insensitive.ref_len) == (lowered.hyp_len, lowered.ref_len)
    assert insensitive.score > score(hypotheses, REFERENCES).score
    assert "|case:lc|" in insensitive.signature and "|case:mixed|" in lowered.signature


@pytest.mark.parametrize(
    ("score", "metric", "name"),
    [
        (corpus_chrf, CHRF(), "chrF2"),
        (partial(corpus_chrf, word_order=2), CHRF(word_order=2), "chrF2++"),
        (partial(corpus_chrf, lowercase=True), CHRF(lowercase=True), "chrF2"),
        (corpus_ter, TER(), "TER"),
        (partial(corpus_ter, case_sensitive=True), TER(case_sensitive=True), "TER"),
    ],
    ids=["chrf", "chrf++", "chrf-lowercase", "ter", "ter-case-sensitive"],
)
def test_chrf_and_ter_are_sacrebleus(score, metric, name):
    """Scores and signatures are those of sacreBLEU's own CHRF and TER objects on the same text."""
    hypotheses = _recased(_degraded(REFERENCES))
    expected = metric.corpus_score(hypotheses, [REFERENCES])
    result = score(hypotheses, REFERENCES)
    assert isinstance(result, MetricResult)
    assert (result.name, result.score) == (name, expected.score)
    assert 1 < result.score < 99  # neither a perfect nor a hopeless score
    assert result.signature == str(metric.get_signature())
    assert str(result) == f"{name} = {expected.score:.2f}"


def test_chrf_and_ter_move_the_right_way():
    """chrF rises and TER falls as the output gets closer to the reference; identical text is 100 and 0."""
    closer, further = _degraded(REFERENCES), _recased(_degraded(REFERENCES))
    assert corpus_chrf(REFERENCES, REFERENCES).score == pytest.approx(100.0)
    assert corpus_ter(REFERENCES, REFERENCES).score == 0.0
    assert corpus_chrf(closer, REFERENCES).score > corpus_chrf(further, REFERENCES).score
    assert corpus_ter(closer, REFERENCES).score < corpus_ter(further, REFERENCES).score
    # TER ignores case by default, as sacreBLEU does; counting it, the lowercased output needs more edits.
    lowered = [line.lower() for line in closer]
    assert corpus_ter(lowered, REFERENCES).score == corpus_ter(closer, REFERENCES).score
    assert corpus_ter(lowered, REFERENCES, case_sensitive=True).score > corpus_ter(closer, REFERENCES).score


def test_the_shipped_metric_loads_by_path_offline():
    assert os.environ["HF_HUB_OFFLINE"] == "1"  # conftest: no network to fall back on
    metric = evaluate.load(SACREBLEU_METRIC)
    hypotheses = _degraded(REFERENCES[:100])
    scored = metric.compute(predictions=hypotheses, references=REFERENCES[:100])
    assert scored["score"] == sacrebleu.corpus_bleu(hypotheses, [REFERENCES[:100]]).score
    assert scored["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|")


def test_compound_splitting_changes_score_as_computed_by_hand():
    unsplit = tokenized_bleu([COMPOUND_HYP], [COMPOUND_REF], compound_split=False)
    split = tokenized_bleu([COMPOUND_HYP], [COMPOUND_REF])
    assert unsplit.score == pytest.approx(100 * (1 / 12) ** 0.25)
    assert split.score == pytest.approx(50.0)
    assert (split.hyp_len, split.ref_len) == (8, 8)
    assert split.signature.startswith("tokenized|pretok:13a|compound:atat|")
    assert unsplit.signature.startswith("tokenized|pretok:13a|compound:no|")
    assert "tok:none|smooth:none" in split.signature


def test_correct_compound_counts_three_tokens():
    # Both sides right: splitting turns one matching token into three, so the score goes up.
    hyp = ["Das Science-Fiction-Buch liegt auf dem Tisch neben der Lampe"]
    ref = ["Das Science-Fiction-Buch liegt auf einem Tisch neben der Lampe"]
    assert tokenized_bleu(hyp, ref).score > tokenized_bleu(hyp, ref, compound_split=False).score


def test_tokenized_bleu_tokenizes_before_splitting():
    # 13a separates punctuation, so pre-tokenized and raw text agree; without hyphens the split is a no-op.
    raw, pretokenized = ["Ein Mann, der läuft."], ["Ein Mann , der läuft ."]
    assert tokenized_bleu(raw, pretokenized).score == pytest.approx(100.0)
    hypotheses = _degraded(REFERENCES)
    without_hyphens = [i for i, ref in enumerate(REFERENCES) if "-" not in ref and "-" not in hypotheses[i]]
    hyps = [hypotheses[i] for i in without_hyphens]
    refs = [REFERENCES[i] for i in without_hyphens]
    assert tokenized_bleu(hyps, refs).score == tokenized_bleu(hyps, refs, compound_split=False).score


def test_split_compounds_follows_the_perl_rule():
    text = "Rich-Text-Formate a-b-c x - y 3-4 -a b-"
    expected = (
        "Rich ##AT##-##AT## Text ##AT##-##AT## Formate a ##AT##-##AT## b-c x - y 3 ##AT##-##AT## 4 -a b-"
    )
    assert split_compounds(text) == expected
    if shutil.which("perl"):
        perl = subprocess.run(
            ["perl", "-ple", "s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g"],
            input=text,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        assert perl.stdout.rstrip("\n") == expected


@pytest.mark.parametrize("score", [corpus_bleu, tokenized_bleu, corpus_chrf, corpus_ter])
def test_input_errors(score):
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        score(["a b", "c d"], ["a b"])
    with pytest.raises(ValueError, match="Empty input"):
        score([], [])
    with pytest.raises(TypeError, match="not a single str"):
        score("a b c", ["a b c"])
    with pytest.raises(TypeError, match=r"references\[1\] is NoneType"):
        score(["a", "b"], ["a", None])


def test_result_serializes():
    result = corpus_bleu([CAT_HYP], [CAT_REF])
    data = json.loads(json.dumps(result.to_dict()))
    assert data["score"] == pytest.approx(CAT_BLEU)
    assert data["signature"] == result.signature
    assert str(result).startswith(f"BLEU = {CAT_BLEU:.2f} 83.3/60.0/50.0/33.3")


@pytest.fixture
def files(tmp_path) -> tuple[Path, Path]:
    hypotheses, references = tmp_path / "hyp.de", tmp_path / "ref.de"
    hypotheses.write_text("\n".join(_degraded(REFERENCES)) + "\n", encoding="utf-8")
    references.write_text("\n".join(REFERENCES) + "\n", encoding="utf-8")
    return hypotheses, references


def test_cli_prints_score_and_signature(files, capsys):
    hypotheses, references = files
    command_module("evaluate").main(["--hypotheses", str(hypotheses), "--references", str(references)])
    # BLEU and chrF by default, as sacreBLEU prints them: the score, then its signature.
    bleu, chrf = (score(_degraded(REFERENCES), REFERENCES) for score in (corpus_bleu, corpus_chrf))
    assert capsys.readouterr().out.strip().splitlines() == [
        str(bleu),
        f"signature: {bleu.signature}",
        f"chrF2 = {CHRF().corpus_score(_degraded(REFERENCES), [REFERENCES]).score:.2f}",
        f"signature: {chrf.signature}",
    ]


def _run_cli(argv: list[str]) -> None:
    command_module("evaluate").main(argv)


def test_cli_json_and_tokenized(files, capsys):
    hypotheses, references = files
    common = ["--hypotheses", str(hypotheses), "--references", str(references), "--json"]
    _run_cli([*common, "--metrics", "bleu"])
    detokenized = json.loads(capsys.readouterr().out)["bleu"]
    _run_cli([*common, "--tokenized"])
    tokenized = json.loads(capsys.readouterr().out)["bleu"]
    for printed, score in ((detokenized, corpus_bleu), (tokenized, tokenized_bleu)):
        expected = score(_degraded(REFERENCES), REFERENCES)
        assert printed["score"] == pytest.approx(expected.score)
        assert printed["signature"] == expected.signature
    assert tokenized["signature"].startswith("tokenized|")
    _run_cli([*common, "--tokenized", "--lowercase"])
    insensitive = json.loads(capsys.readouterr().out)["bleu"]
    expected = tokenized_bleu(_degraded(REFERENCES), REFERENCES, lowercase=True)
    assert (insensitive["score"], insensitive["signature"]) == (expected.score, expected.signature)


def test_cli_reports_mismatched_files(files, tmp_path, capsys):
    hypotheses, _ = files
    short = tmp_path / "short.de"
    short.write_text("Ein Hund.\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        _run_cli(["--hypotheses", str(hypotheses), "--references", str(short)])
    assert exit_info.value.code == 2
    assert "1000 hypotheses but 1 references" in capsys.readouterr().err


def test_cli_reads_past_a_byte_order_mark(files, tmp_path, capsys):
    """Windows editors start UTF-8 files with a byte-order mark; it is not part of the first sentence."""
    _, references = files
    with_mark = tmp_path / "bom.de"
    with_mark.write_bytes(b"\xef\xbb\xbf" + references.read_bytes())
    _run_cli(["--hypotheses", str(with_mark), "--references", str(references), "--json"])
    assert json.loads(capsys.readouterr().out)["bleu"]["score"] == pytest.approx(100.0)


def test_cli_metrics_are_sacrebleus(files, capsys):
    """`--metrics bleu chrf ter --chrf-word-order 2`: every score and signature is sacreBLEU's own, in the
    order asked for; `--lowercase` reaches chrF, and TER stays case-insensitive as in sacreBLEU."""
    hypotheses, references = files
    system = _degraded(REFERENCES)
    common = ["--hypotheses", str(hypotheses), "--references", str(references), "--json"]
    _run_cli([*common, "--metrics", "ter", "chrf", "bleu", "--chrf-word-order", "2", "--lowercase"])
    printed = json.loads(capsys.readouterr().out)
    assert list(printed) == ["ter", "chrf", "bleu"]
    for name, metric in (
        ("ter", TER()),
        ("chrf", CHRF(word_order=2, lowercase=True)),
        ("bleu", BLEU(lowercase=True)),
    ):
        expected = metric.corpus_score(system, [REFERENCES])
        assert printed[name]["score"] == expected.score, name
        assert printed[name]["signature"] == str(metric.get_signature()), name
    assert printed["chrf"]["name"] == "chrF2++" and printed["ter"]["name"] == "TER"

    _run_cli(common[:-1] + ["--metrics", "ter"])
    ter = TER()
    expected = ter.corpus_score(system, [REFERENCES])
    assert capsys.readouterr().out.splitlines() == [
        f"TER = {expected.score:.2f}",
        f"signature: {ter.get_signature()}",
    ]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--metrics", "chrf", "--tokenized"], "--tokenized applies to BLEU"),
        (["--metrics", "bleu", "--chrf-word-order", "2"], "--chrf-word-order applies to chrF"),
        (["--metrics", "meteor"], "invalid choice: 'meteor'"),
        (["--chrf-word-order", "-1"], "--chrf-word-order"),
    ],
)
def test_cli_refuses_flags_for_metrics_it_does_not_compute(files, capsys, flags, message):
    hypotheses, references = files
    with pytest.raises(SystemExit) as exit_info:
        _run_cli(["--hypotheses", str(hypotheses), "--references", str(references), *flags])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and ": error: " in error and message in error
