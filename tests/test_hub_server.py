"""The real huggingface_hub and transformers clients against the test Hub server (tests/hub_server.py).

The clients read HF_ENDPOINT and the other settings at import time, so each client session runs in a
subprocess (`run_client`) that prints one JSON document for the test to check.
"""

import hashlib
import http.client
import json
import random
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hub_server import (
    GITATTRIBUTES,
    LFS_THRESHOLD,
    READ_TOKEN,
    WRITE_TOKEN,
    AddFile,
    HubError,
    HubServer,
    hub_env,
    start_hub_server,
)

# Just above the threshold, and a suffix the Hub stores in LFS: the upload must take the LFS path.
WEIGHTS = random.Random(0).randbytes(LFS_THRESHOLD + 4096)
HELLO = b"hello hub\n"
GUIDE = b"# Guide\n"
DEV = b"only on dev\n"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_client(env: dict[str, str], *parts: str, **args: Any) -> Any:
    """Run the script made of `parts` in a fresh interpreter; return the JSON it prints last.

    `args` reach the script as JSON in sys.argv[1].
    """
    script = "\n".join(textwrap.dedent(part) for part in parts)
    result = subprocess.run(
        [sys.executable, "-c", script, json.dumps(args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"client failed:\n{result.stderr[-6000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    with start_hub_server(tmp_path_factory.mktemp("hub")) as server:
        yield server


@pytest.fixture(scope="module")
def files_repo(hub: HubServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """org/files: main holds an upload_folder commit, branch dev one more upload_file commit."""
    folder = tmp_path_factory.mktemp("upload")
    (folder / "hello.txt").write_bytes(HELLO)
    (folder / "weights.bin").write_bytes(WEIGHTS)
    (folder / "docs").mkdir()
    (folder / "docs" / "guide.md").write_bytes(GUIDE)
    script = """
        import json, sys
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError

        args = json.loads(sys.argv[1])
        api = HfApi()
        api.create_repo("org/files")
        try:
            api.create_repo("org/files")
            second_create = None
        except HfHubHTTPError as error:
            second_create = error.response.status_code
        url = api.create_repo("org/files", exist_ok=True)
        main = api.upload_folder(folder_path=args["folder"], repo_id="org/files", commit_message="Add files")
        api.create_branch("org/files", branch="dev")
        try:
            api.create_branch("org/files", branch="dev")
            second_branch = None
        except HfHubHTTPError as error:
            second_branch = error.response.status_code
        dev = api.upload_file(
            path_or_fileobj=args["dev"].encode(), path_in_repo="dev.txt", repo_id="org/files", revision="dev"
        )
        refs = {ref.name: ref.target_commit for ref in api.list_repo_refs("org/files").branches}
        print(json.dumps({
            "second_create": second_create, "second_branch": second_branch, "url": url.repo_id,
            "main": main.oid, "dev": dev.oid, "refs": refs,
        }))
    """
    env = hub_env(hub, tmp_path_factory.mktemp("hf_home"))
    pushed = run_client(env, script, folder=str(folder), dev=DEV.decode())
    assert pushed["second_create"] == 409
    assert pushed["second_branch"] == 409
    assert pushed["url"] == "org/files"
    return pushed


def test_commits_and_branches_get_their_own_ids(files_repo: dict[str, Any]) -> None:
    assert len({files_repo["main"], files_repo["dev"]}) == 2
    assert files_repo["refs"] == {"main": files_repo["main"], "dev": files_repo["dev"]}


def test_large_binary_file_takes_the_lfs_path(hub: HubServer, files_repo: dict[str, Any]) -> None:
    upload_path = f"/lfs-upload/{sha256(WEIGHTS)}/{len(WEIGHTS)}"
    assert [r.status for r in hub.requests if (r.method, r.path) == ("PUT", upload_path)] == [200]
    main = hub.storage.resolve(hub.storage.repo("model", "org/files"), files_repo["main"])
    assert main.files["weights.bin"].lfs
    assert not main.files["hello.txt"].lfs
    assert hub.storage.blob_path(main.files["weights.bin"].sha256).read_bytes() == WEIGHTS


DOWNLOAD = """
    import hashlib, json, sys
    from pathlib import Path
    from huggingface_hub import hf_hub_download, snapshot_download

    args = json.loads(sys.argv[1])

    def digest(path):
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()

    files = {
        "hello": digest(hf_hub_download("org/files", "hello.txt")),
        "weights@commit": digest(hf_hub_download("org/files", "weights.bin", revision=args["main"])),
        "guide@dev": digest(hf_hub_download("org/files", "docs/guide.md", revision="dev")),
        "dev@dev": digest(hf_hub_download("org/files", "dev.txt", revision="dev")),
    }
    snapshot = Path(snapshot_download("org/files", revision="dev"))
    files |= {
        f"snapshot/{path.relative_to(snapshot).as_posix()}": digest(path)
        for path in sorted(snapshot.rglob("*")) if path.is_file()
    }
    print(json.dumps(files))
"""


def expected_downloads() -> dict[str, str]:
    snapshot = {"hello.txt": HELLO, "weights.bin": WEIGHTS, "docs/guide.md": GUIDE, "dev.txt": DEV}
    return {
        "hello": sha256(HELLO),
        "weights@commit": sha256(WEIGHTS),
        "guide@dev": sha256(GUIDE),
        "dev@dev": sha256(DEV),
        **{f"snapshot/{path}": sha256(data) for path, data in snapshot.items()},
    }


def test_download_by_repo_id_branch_commit_and_snapshot(
    hub: HubServer, files_repo: dict[str, Any], tmp_path: Path
) -> None:
    files = run_client(hub_env(hub, tmp_path), DOWNLOAD, main=files_repo["main"])
    files.pop("snapshot/.gitattributes")
    assert files == expected_downloads()


def test_filled_cache_serves_downloads_offline(
    hub: HubServer, files_repo: dict[str, Any], tmp_path: Path
) -> None:
    online = run_client(hub_env(hub, tmp_path), DOWNLOAD, main=files_repo["main"])
    requests_before = len(hub.requests)
    offline = run_client(hub_env(hub, tmp_path, offline=True), DOWNLOAD, main=files_repo["main"])
    assert offline == online
    assert len(hub.requests) == requests_before


def test_missing_file_repo_and_revision_raise_their_errors(
    hub: HubServer, files_repo: dict[str, Any], tmp_path: Path
) -> None:
    script = """
        import json
        from huggingface_hub import hf_hub_download

        def error_of(repo_id, filename, **kwargs):
            try:
                hf_hub_download(repo_id, filename, **kwargs)
            except Exception as error:
                return type(error).__name__
            return None

        print(json.dumps({
            "file": error_of("org/files", "missing.txt"),
            "file only on another branch": error_of("org/files", "dev.txt"),
            "repo": error_of("org/absent", "hello.txt"),
            "revision": error_of("org/files", "hello.txt", revision="no-such-branch"),
        }))
    """
    assert run_client(hub_env(hub, tmp_path), script) == {
        "file": "RemoteEntryNotFoundError",
        "file only on another branch": "RemoteEntryNotFoundError",
        "repo": "RepositoryNotFoundError",
        "revision": "RevisionNotFoundError",
    }


def test_tags_pull_requests_deletions_and_dataset_repos(hub: HubServer, tmp_path: Path) -> None:
    script = """
        import json
        from pathlib import Path
        from huggingface_hub import CommitOperationDelete, HfApi, hf_hub_download

        api = HfApi()
        api.create_repo("org/refs")
        v1 = api.upload_file(path_or_fileobj=b"v1", path_in_repo="a/file.txt", repo_id="org/refs")
        api.create_tag("org/refs", tag="v1")
        pr = api.upload_file(
            path_or_fileobj=b"proposed", path_in_repo="a/file.txt", repo_id="org/refs", create_pr=True
        )
        api.create_commit("org/refs", operations=[CommitOperationDelete("a/")], commit_message="Remove a/")
        api.create_repo("org/refs", repo_type="dataset")
        api.upload_file(
            path_or_fileobj=b"rows", path_in_repo="data.csv", repo_id="org/refs", repo_type="dataset"
        )
        refs = api.list_repo_refs("org/refs", include_pull_requests=True)

        def read(filename, **kwargs):
            return Path(hf_hub_download("org/refs", filename, **kwargs)).read_text()

        print(json.dumps({
            "tag": read("a/file.txt", revision="v1"),
            "pr_revision": pr.pr_revision,
            "pr": read("a/file.txt", revision=pr.pr_revision),
            "main_files": api.list_repo_files("org/refs"),
            "dataset": read("data.csv", repo_type="dataset"),
            "tags": {ref.name: ref.target_commit for ref in refs.tags},
            "v1": v1.oid,
            "pull_requests": [ref.ref for ref in refs.pull_requests],
        }))
    """
    result = run_client(hub_env(hub, tmp_path), script)
    assert result["tag"] == "v1"
    assert result["pr_revision"] == "refs/pr/1"
    assert result["pr"] == "proposed"
    assert result["main_files"] == [".gitattributes"]
    assert result["dataset"] == "rows"
    assert result["tags"] == {"v1": result["v1"]}
    assert result["pull_requests"] == ["refs/pr/1"]


def test_listings_and_account_endpoints(hub: HubServer, files_repo: dict[str, Any], tmp_path: Path) -> None:
    script = """
        import json
        from huggingface_hub import HfApi
        from huggingface_hub.errors import RepositoryNotFoundError

        api = HfApi()
        info = api.model_info("org/files", files_metadata=True)
        paths = api.get_paths_info("org/files", ["docs", "hello.txt", "absent"], revision="dev")
        api.create_repo("org/doomed")
        api.delete_repo("org/doomed")
        try:
            api.delete_repo("org/doomed")
            second_delete = None
        except RepositoryNotFoundError as error:
            second_delete = type(error).__name__
        print(json.dumps({
            "user": api.whoami()["name"],
            "sha": info.sha,
            "siblings": {s.rfilename: [s.size, s.lfs and s.lfs.sha256] for s in info.siblings},
            "tree": {entry.path: type(entry).__name__ for entry in api.list_repo_tree("org/files")},
            "paths": {entry.path: type(entry).__name__ for entry in paths},
            "doomed_exists": api.repo_exists("org/doomed"),
            "second_delete": second_delete,
        }))
    """
    assert run_client(hub_env(hub, tmp_path), script) == {
        "user": "user",
        "sha": files_repo["main"],
        "siblings": {
            ".gitattributes": [len(GITATTRIBUTES), None],
            "docs/guide.md": [len(GUIDE), None],
            "hello.txt": [len(HELLO), None],
            "weights.bin": [len(WEIGHTS), sha256(WEIGHTS)],
        },
        "tree": {
            ".gitattributes": "RepoFile",
            "docs": "RepoFolder",
            "hello.txt": "RepoFile",
            "weights.bin": "RepoFile",
        },
        "paths": {"docs": "RepoFolder", "hello.txt": "RepoFile"},
        "doomed_exists": False,
        "second_delete": "RepositoryNotFoundError",
    }


# Equal digests of every tensor's bytes, in key order, mean identical weights.
STATE_DIGEST = """
    import hashlib

    def state_digest(model):
        digest = hashlib.sha256()
        for key, tensor in sorted(model.state_dict().items()):
            digest.update(key.encode() + tensor.detach().contiguous().cpu().numpy().tobytes())
        return digest.hexdigest()
"""

PUSH_TINY = """
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import MarianConfig, MarianMTModel, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = MarianConfig(
        vocab_size=8, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
        pad_token_id=0, eos_token_id=1, forced_eos_token_id=1, decoder_start_token_id=0,
    )
    model, branch_model = MarianMTModel(config), MarianMTModel(config)
    model.push_to_hub("org/tiny")
    branch_model.push_to_hub("org/tiny", revision="branch")

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, "hello": 3, "world": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    tokenizer.push_to_hub("org/tiny")

    pushed = {
        "main": state_digest(model),
        "branch": state_digest(branch_model),
        "ids": tokenizer("hello world again")["input_ids"],
    }
"""

# Loading the tokenizer probes optional files, which must answer 404 EntryNotFound.
LOAD_TINY = """
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained("org/tiny")
    loaded = {
        "main": state_digest(AutoModelForSeq2SeqLM.from_pretrained("org/tiny")),
        "branch": state_digest(AutoModelForSeq2SeqLM.from_pretrained("org/tiny", revision="branch")),
        "ids": tokenizer("hello world again")["input_ids"],
    }
"""


@pytest.fixture(scope="module")
def tiny_repo(hub: HubServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """org/tiny: a tiny random Marian model and a tokenizer on main, other weights on branch `branch`."""
    hf_home = tmp_path_factory.mktemp("hf_home")
    report = 'import json; print(json.dumps({"pushed": pushed, "loaded": loaded}))'
    return run_client(hub_env(hub, hf_home), STATE_DIGEST, PUSH_TINY, LOAD_TINY, report) | {
        "hf_home": hf_home
    }


def test_from_pretrained_returns_pushed_weights(tiny_repo: dict[str, Any]) -> None:
    pushed, loaded = tiny_repo["pushed"], tiny_repo["loaded"]
    assert pushed["main"] != pushed["branch"]
    assert loaded["main"] == pushed["main"]
    assert loaded["branch"] == pushed["branch"]


def test_auto_tokenizer_loads_pushed_tokenizer(tiny_repo: dict[str, Any]) -> None:
    assert tiny_repo["loaded"]["ids"] == tiny_repo["pushed"]["ids"] == [3, 4, 2]


def test_from_pretrained_works_offline_from_filled_cache(hub: HubServer, tiny_repo: dict[str, Any]) -> None:
    requests_before = len(hub.requests)
    env = hub_env(hub, tiny_repo["hf_home"], offline=True)
    loaded = run_client(env, STATE_DIGEST, LOAD_TINY, "import json; print(json.dumps(loaded))")
    assert loaded == tiny_repo["loaded"]
    assert len(hub.requests) == requests_before


# Plain HTTP checks of what the clients above rarely exercise.


def make_repo(hub: HubServer, repo_id: str, files: dict[str, bytes]) -> str:
    storage = hub.storage
    storage.create_repo("model", repo_id)
    repo = storage.repo("model", repo_id)
    operations = [AddFile(path, storage.add_regular_file(data)) for path, data in files.items()]
    return storage.commit(repo, "main", "Add files", operations)[0].oid


def fetch(
    hub: HubServer,
    path: str,
    method: str = "GET",
    body: bytes | None = None,
    token: str | None = WRITE_TOKEN,
    **headers: str,
) -> tuple[int, dict[str, str], bytes]:
    """One request, with `token` as the bearer token (None: no Authorization header)."""
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(hub.url + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_resolve_headers_and_ranges(hub: HubServer) -> None:
    digits = b"0123456789"
    oid = make_repo(hub, "org/ranges", {"digits.txt": digits})
    status, headers, body = fetch(hub, "/org/ranges/resolve/main/digits.txt", "HEAD")
    assert (status, body) == (200, b"")
    assert headers["X-Repo-Commit"] == oid
    assert headers["Content-Length"] == "10"
    git_blob_oid = hashlib.sha1(b"blob 10\0" + digits).hexdigest()
    assert headers["ETag"] == f'"{git_blob_oid}"'
    assert fetch(hub, f"/org/ranges/resolve/{oid}/digits.txt", Range="bytes=2-5")[::2] == (206, b"2345")
    assert fetch(hub, "/org/ranges/resolve/main/digits.txt", Range="bytes=7-")[2] == b"789"
    assert fetch(hub, "/org/ranges/resolve/main/digits.txt", Range="bytes=-3")[2] == b"789"
    status, headers, _ = fetch(hub, "/org/ranges/resolve/main/digits.txt", Range="bytes=10-")
    assert (status, headers["Content-Range"]) == (416, "bytes */10")
    status, headers, _ = fetch(hub, "/org/ranges/resolve/refs%2Fheads%2Fmain/missing.txt")
    assert (status, headers["X-Error-Code"], headers["X-Repo-Commit"]) == (404, "EntryNotFound", oid)


def test_lfs_upload_checks_content_and_commit_needs_uploaded_objects(hub: HubServer) -> None:
    make_repo(hub, "org/lfs", {})
    data = b"weights"
    status, _, _ = fetch(hub, f"/lfs-upload/{sha256(data)}/{len(data)}", "PUT", b"tampered")
    assert status == 400
    assert not hub.storage.has_blob(sha256(data))
    item = {"key": "lfsFile", "value": {"path": "w.bin", "algo": "sha256", "oid": sha256(data)}}
    status, _, body = fetch(hub, "/api/models/org/lfs/commit/main", "POST", json.dumps(item).encode())
    assert status == 400
    assert b"was not uploaded" in body


def test_error_answers_leave_the_connection_usable(hub: HubServer) -> None:
    make_repo(hub, "org/keepalive", {"a.txt": b"a"})
    connection = http.client.HTTPConnection(hub.url.removeprefix("http://"))
    try:
        body = b'{"key": "header"}\n' * 1000
        authorization = {"Authorization": f"Bearer {WRITE_TOKEN}"}
        connection.request("POST", "/api/models/org/absent/commit/main", body=body, headers=authorization)
        response = connection.getresponse()
        assert (response.status, response.getheader("X-Error-Code")) == (404, "RepoNotFound")
        response.read()
        connection.request("GET", "/org/keepalive/resolve/main/a.txt")
        assert connection.getresponse().read() == b"a"
    finally:
        connection.close()


def test_tokens_are_checked_as_on_the_hub(hub: HubServer) -> None:
    make_repo(hub, "org/guarded", {"a.txt": b"a"})
    create = json.dumps({"name": "created", "organization": "org", "type": "model"}).encode()
    assert fetch(hub, "/api/repos/create", "POST", create, token=None)[0] == 401
    assert fetch(hub, "/api/repos/create", "POST", create, token="hf_unknown")[0] == 401
    status, headers, _ = fetch(hub, "/api/repos/create", "POST", create, token=READ_TOKEN)
    assert status == 403 and "read-only token" in headers["X-Error-Message"]
    assert fetch(hub, "/api/models/org/guarded/commit/main", "POST", b"", token=READ_TOKEN)[0] == 403
    with pytest.raises(HubError, match="not found"):
        hub.storage.repo("model", "org/created")
    # An unknown token is refused even for reading; no token or a read token may read.
    assert fetch(hub, "/org/guarded/resolve/main/a.txt", token="hf_unknown")[0] == 401
    assert fetch(hub, "/org/guarded/resolve/main/a.txt", token=None)[::2] == (200, b"a")
    assert fetch(hub, "/org/guarded/resolve/main/a.txt", token=READ_TOKEN)[::2] == (200, b"a")
    whoami = json.loads(fetch(hub, "/api/whoami-v2", token=READ_TOKEN)[2])
    assert whoami["auth"]["accessToken"]["role"] == "read"
    assert fetch(hub, "/api/repos/create", "POST", create)[0] == 200
    assert not hub.storage.repo("model", "org/created").private
