"""A small Hugging Face Hub API server that stands in for the real Hub in tests only.

It implements the HTTP calls that `huggingface_hub` (and so `transformers`) makes for a push and a pull:
repo creation and deletion, preupload, the git-LFS batch API and the PUT it points to, the NDJSON commit
endpoint, repo info, tree and paths-info listings, refs, branches, tags and `resolve` downloads (with
Range support). Tokens behave as on the Hub: a request bearing an unknown token is refused with 401, and
writing needs `WRITE_TOKEN` (no token: 401; `READ_TOKEN`: 403). Revisions behave as on the Hub: every
commit gets a new id, branches and tags point at commits, `main` is the default branch, and a download may
name a commit id, a branch, a tag or a URL-encoded ref such as `refs%2Fpr%2F1`.

Uploads over xet cannot be tested offline: clients must set HF_HUB_DISABLE_XET=1 so that large files take
the classic LFS path (batch request, then a plain PUT). `hub_env` builds such an environment.

File contents are stored under `<root>/blobs/<sha256>`; repos, refs and commits live in memory and vanish
with the server. Request bodies are read whole into memory, which suits test-sized files only, and must
come with a Content-Length (huggingface_hub always sends one).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

USER = "user"
WRITE_TOKEN = "hf_test_write"
READ_TOKEN = "hf_test_read"
TOKEN_ROLES = {WRITE_TOKEN: "write", READ_TOKEN: "read"}
DEFAULT_BRANCH = "main"
# The Hub refuses files above 10 MB outside LFS, and stores these suffixes in LFS whatever their size.
LFS_THRESHOLD = 10 * 1024 * 1024
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".npy", ".npz")
GITATTRIBUTES = "".join(f"*{suffix} filter=lfs diff=lfs merge=lfs -text\n" for suffix in LFS_SUFFIXES)
REPO_TYPES = ("model", "dataset", "space")
URL_PREFIXES = {"model": "", "dataset": "datasets/", "space": "spaces/"}
PREFIX_TYPES = {"datasets": "dataset", "spaces": "space"}
CHUNK_SIZE = 1024 * 1024


class HubError(Exception):
    """An error answered as JSON, with the `X-Error-Code` the client maps to its exception classes."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = dict(headers or {})
        self.body = dict(body or {})


def _now() -> str:
    # The client parses dates in exactly this format (huggingface_hub.utils.parse_datetime).
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def is_lfs(path: str, size: int, sample: bytes) -> bool:
    """Upload mode the Hub would choose: LFS for big files, binary files and weight formats."""
    return path.endswith(LFS_SUFFIXES) or size > LFS_THRESHOLD or b"\0" in sample


def _check_path(path: str) -> str:
    parts = path.split("/")
    if not path or path.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise HubError(400, f"Invalid path in repo: {path!r}")
    return path


@dataclass(frozen=True)
class FileEntry:
    """One file of a commit. `git_oid` is the git blob id (of the LFS pointer for LFS files)."""

    sha256: str
    size: int
    lfs: bool
    git_oid: str

    @property
    def etag(self) -> str:
        # What the client names cached blobs after: sha256 for LFS files, the git blob id otherwise.
        return self.sha256 if self.lfs else self.git_oid

    @property
    def pointer_size(self) -> int:
        return len(_lfs_pointer(self.sha256, self.size))

    def tree_json(self, path: str) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "file", "path": path, "size": self.size, "oid": self.git_oid}
        if self.lfs:
            entry["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": self.pointer_size}
        return entry


@dataclass(frozen=True)
class Commit:
    oid: str
    parent: str | None
    files: Mapping[str, FileEntry]
    title: str
    date: str

    def folder_exists(self, path: str) -> bool:
        return any(name.startswith(path + "/") for name in self.files)

    def folder_json(self, path: str) -> dict[str, Any]:
        listing = "".join(
            f"{name} {entry.git_oid}\n"
            for name, entry in sorted(self.files.items())
            if name.startswith(path + "/")
        )
        return {
            "type": "directory",
            "path": path,
            "size": 0,
            "oid": hashlib.sha1(listing.encode()).hexdigest(),
        }


@dataclass(frozen=True)
class AddFile:
    path: str
    entry: FileEntry


@dataclass(frozen=True)
class Delete:
    path: str
    folder: bool = False


Operation = AddFile | Delete


@dataclass
class Repo:
    repo_type: str
    repo_id: str
    created: str
    private: bool = False
    commits: dict[str, Commit] = field(default_factory=dict)
    # Full git ref names ("refs/heads/main", "refs/tags/v1", "refs/pr/1") -> commit oid.
    refs: dict[str, str] = field(default_factory=dict)


class HubStorage:
    """Repos with their refs and immutable commits; file contents in a content-addressed folder."""

    def __init__(self, root: Path) -> None:
        self._blobs = root / "blobs"
        self._blobs.mkdir(parents=True, exist_ok=True)
        self._repos: dict[tuple[str, str], Repo] = {}
        self._lock = threading.RLock()

    def blob_path(self, sha256: str) -> Path:
        return self._blobs / sha256

    def has_blob(self, sha256: str) -> bool:
        return self.blob_path(sha256).is_file()

    def _write_blob(self, data: bytes) -> str:
        sha256 = hashlib.sha256(data).hexdigest()
        if not self.has_blob(sha256):
            # Write then rename, so that a concurrent reader never sees a partial blob.
            tmp = self._blobs / f".{sha256}.{threading.get_ident()}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, self.blob_path(sha256))
        return sha256

    def add_regular_file(self, data: bytes) -> FileEntry:
        return FileEntry(self._write_blob(data), len(data), lfs=False, git_oid=_git_blob_oid(data))

    def add_lfs_object(self, oid: str, size: int, data: bytes) -> None:
        if len(data) != size or hashlib.sha256(data).hexdigest() != oid:
            raise HubError(400, f"Uploaded content does not match LFS object {oid} of size {size}")
        self._write_blob(data)

    def lfs_entry(self, oid: str, size: int | None) -> FileEntry:
        if not self.has_blob(oid):
            raise HubError(400, f"LFS object {oid} was not uploaded")
        actual_size = self.blob_path(oid).stat().st_size
        if size is not None and size != actual_size:
            raise HubError(400, f"LFS object {oid} has size {actual_size}, not {size}")
        return FileEntry(oid, actual_size, lfs=True, git_oid=_git_blob_oid(_lfs_pointer(oid, actual_size)))

    def create_repo(self, repo_type: str, repo_id: str, private: bool = False) -> bool:
        """Create a repo with the Hub's initial commit; False if it already exists."""
        with self._lock:
            if (repo_type, repo_id) in self._repos:
                return False
            repo = Repo(repo_type, repo_id, created=_now(), private=private)
            initial = {".gitattributes": self.add_regular_file(GITATTRIBUTES.encode())}
            self._add_commit(repo, f"refs/heads/{DEFAULT_BRANCH}", None, initial, "initial commit")
            self._repos[repo_type, repo_id] = repo
            return True

    def delete_repo(self, repo_type: str, repo_id: str) -> None:
        with self._lock:
            if self._repos.pop((repo_type, repo_id), None) is None:
                raise HubError(404, f"Repository {repo_id} not found", "RepoNotFound")

    def repo(self, repo_type: str, repo_id: str) -> Repo:
        with self._lock:
            try:
                return self._repos[repo_type, repo_id]
            except KeyError:
                raise HubError(404, f"Repository {repo_id} not found", "RepoNotFound") from None

    def resolve(self, repo: Repo, revision: str) -> Commit:
        """Commit named by a branch, a tag, a full ref name or a commit id (or its unique prefix)."""
        with self._lock:
            for ref in (f"refs/heads/{revision}", f"refs/tags/{revision}", revision):
                if ref in repo.refs:
                    return repo.commits[repo.refs[ref]]
            if re.fullmatch(r"[0-9a-f]{7,40}", revision):
                matches = [oid for oid in repo.commits if oid.startswith(revision)]
                if len(matches) == 1:
                    return repo.commits[matches[0]]
        raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")

    def create_ref(self, repo: Repo, ref: str, oid: str) -> bool:
        """Point a new ref at a commit; False if the ref already exists."""
        with self._lock:
            if ref in repo.refs:
                return False
            repo.refs[ref] = oid
            return True

    def commit(
        self,
        repo: Repo,
        revision: str,
        title: str,
        operations: list[Operation],
        parent_commit: str | None = None,
        create_pr: bool = False,
    ) -> tuple[Commit, str]:
        """Apply operations on top of a branch (or a new PR ref); returns the commit and its ref."""
        with self._lock:
            ref = revision if revision.startswith("refs/pr/") else f"refs/heads/{revision}"
            if ref not in repo.refs:
                raise HubError(404, f"Invalid rev id: {revision} is not a branch", "RevisionNotFound")
            head = repo.commits[repo.refs[ref]]
            if parent_commit is not None and parent_commit != head.oid:
                raise HubError(412, f"Parent commit {parent_commit} is not the head of {revision}")
            if create_pr:
                ref = f"refs/pr/{1 + sum(name.startswith('refs/pr/') for name in repo.refs)}"
            files = dict(head.files)
            for op in operations:
                if isinstance(op, AddFile):
                    files[op.path] = op.entry
                    continue
                if op.folder:
                    doomed = [name for name in files if name.startswith(op.path + "/")]
                else:
                    doomed = [op.path] if op.path in files else []
                if not doomed:
                    kind = "folder" if op.folder else "file"
                    raise HubError(404, f"A {kind} with this name doesn't exist: {op.path}", "EntryNotFound")
                for name in doomed:
                    del files[name]
            return self._add_commit(repo, ref, head.oid, files, title), ref

    def _add_commit(
        self, repo: Repo, ref: str, parent: str | None, files: dict[str, FileEntry], title: str
    ) -> Commit:
        # Like git, the id covers the parent, the tree, the message and a timestamp.
        listing = "".join(f"{name} {entry.git_oid}\n" for name, entry in sorted(files.items()))
        seed = f"{parent}\n{listing}{title}\n{time.time_ns()}"
        commit = Commit(
            hashlib.sha1(seed.encode()).hexdigest(), parent, MappingProxyType(files), title, _now()
        )
        repo.commits[commit.oid] = commit
        repo.refs[ref] = commit.oid
        return commit


REPO = r"(?P<repo>[^/]+/[^/]+)"
API = r"/api/(?P<kind>models|datasets|spaces)/" + REPO
PREFIXED = r"/(?:(?P<prefix>datasets|spaces)/)?" + REPO
# (methods, raw path pattern, handler method). Groups match the still percent-encoded path, so that a
# revision such as "refs%2Fpr%2F1" stays one segment; they are decoded before the handler is called.
ROUTES: list[tuple[tuple[str, ...], re.Pattern[str], str]] = [
    (("GET",), re.compile(r"/api/whoami-v2"), "whoami"),
    (("POST",), re.compile(r"/api/repos/create"), "create_repo"),
    (("DELETE",), re.compile(r"/api/repos/delete"), "delete_repo"),
    (("POST",), re.compile(r"/api/validate-yaml"), "validate_yaml"),
    (("GET",), re.compile(API + r"(?:/revision/(?P<rev>[^/]+))?"), "repo_info"),
    (("GET",), re.compile(API + r"/tree/(?P<rev>[^/]+)(?:/(?P<path>.+))?"), "tree"),
    (("POST",), re.compile(API + r"/paths-info/(?P<rev>[^/]+)"), "paths_info"),
    (("GET",), re.compile(API + r"/refs"), "refs"),
    (("POST",), re.compile(API + r"/branch/(?P<name>[^/]+)"), "create_branch"),
    (("POST",), re.compile(API + r"/tag/(?P<rev>[^/]+)"), "create_tag"),
    (("POST",), re.compile(API + r"/preupload/(?P<rev>[^/]+)"), "preupload"),
    (("POST",), re.compile(API + r"/commit/(?P<rev>[^/]+)"), "commit"),
    (("POST",), re.compile(PREFIXED + r"\.git/info/lfs/objects/batch"), "lfs_batch"),
    (("PUT",), re.compile(r"/lfs-upload/(?P<oid>[0-9a-f]{64})/(?P<size>[0-9]+)"), "lfs_upload"),
    (("GET", "HEAD"), re.compile(PREFIXED + r"/resolve/(?P<rev>[^/]+)/(?P<path>.+)"), "resolve"),
]
# Routes that change the Hub and so need a token with write access. The LFS upload itself goes to the URL
# the batch answer handed out (on the Hub, presigned storage), without the Hub token.
WRITE_ROUTES = {
    "create_repo",
    "delete_repo",
    "create_branch",
    "create_tag",
    "preupload",
    "commit",
    "lfs_batch",
}


@dataclass(frozen=True)
class RequestRecord:
    method: str
    path: str
    status: int


class HubRequestHandler(BaseHTTPRequestHandler):
    """Routes each request to a `route_*` method; a `HubError` becomes a JSON error answer."""

    # Keep-alive, as the client reuses connections: every answer must then carry a Content-Length.
    protocol_version = "HTTP/1.1"
    server: HubServer
    body: bytes
    query: dict[str, list[str]]

    def do_GET(self) -> None:
        self._dispatch()

    do_HEAD = do_POST = do_PUT = do_DELETE = do_GET

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self.server.requests.append(RequestRecord(self.command, self.path, int(code)))

    def _dispatch(self) -> None:
        # Read the body before anything can fail: bytes left unread would corrupt the next request
        # the client sends on this kept-alive connection.
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length)
        url = urlsplit(self.path)
        self.query = parse_qs(url.query)
        try:
            for methods, pattern, name in ROUTES:
                match = pattern.fullmatch(url.path)
                if match and self.command in methods:
                    self._authorize(name)
                    params = {
                        key: unquote(value) for key, value in match.groupdict().items() if value is not None
                    }
                    getattr(self, f"route_{name}")(**params)
                    return
            raise HubError(404, f"No route for {self.command} {url.path}")
        except HubError as error:
            # Header values must be latin-1: escape whatever a path in the message brings in.
            message = error.message.encode("ascii", "backslashreplace").decode()
            headers = {"X-Error-Message": message, **error.headers}
            if error.code:
                headers["X-Error-Code"] = error.code
            self._send_json({"error": error.message, **error.body}, error.status, headers)
        except Exception as error:  # a server bug: answer it rather than drop the connection
            traceback.print_exc()
            self._send_json({"error": repr(error)}, 500)

    # Helpers

    def _token_role(self) -> str | None:
        """The role of the request's token ("write" or "read"), None without one; 401 for an unknown one."""
        authorization = self.headers.get("Authorization")
        if authorization is None:
            return None
        role = TOKEN_ROLES.get(authorization.removeprefix("Bearer "))
        if role is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        return role

    def _authorize(self, route: str) -> None:
        role = self._token_role()
        if route in WRITE_ROUTES and role is None:
            raise HubError(401, "You must be authenticated to write to the Hub")
        if route in WRITE_ROUTES and role != "write":
            raise HubError(403, "You don't have the rights to write with a read-only token")

    def _send_json(
        self,
        payload: Any,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json_body(self) -> dict[str, Any]:
        try:
            return json.loads(self.body or b"{}")
        except json.JSONDecodeError as error:
            raise HubError(400, f"Invalid JSON body: {error}") from None

    def _repo(self, kind: str | None = None, prefix: str | None = None, *, repo: str) -> Repo:
        repo_type = kind.removesuffix("s") if kind else PREFIX_TYPES.get(prefix or "", "model")
        return self.server.storage.repo(repo_type, repo)

    def _repo_url(self, repo: Repo) -> str:
        return f"{self.server.url}/{URL_PREFIXES[repo.repo_type]}{repo.repo_id}"

    def _repo_type_and_id(self) -> tuple[str, str]:
        body = self._json_body()
        repo_type = body.get("type") or "model"
        if repo_type not in REPO_TYPES:
            raise HubError(400, f"Invalid repo type: {repo_type}")
        return repo_type, f"{body.get('organization') or USER}/{body['name']}"

    # Account and repos

    def route_whoami(self) -> None:
        role = self._token_role()
        if role is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        token = {"displayName": "test-token", "role": role}
        self._send_json(
            {
                "type": "user",
                "name": USER,
                "fullname": "Test User",
                "orgs": [],
                "auth": {"type": "access_token", "accessToken": token},
            }
        )

    def route_create_repo(self) -> None:
        repo_type, repo_id = self._repo_type_and_id()
        url = f"{self.server.url}/{URL_PREFIXES[repo_type]}{repo_id}"
        body = self._json_body()
        private = body.get("visibility") == "private" or bool(body.get("private"))
        if not self.server.storage.create_repo(repo_type, repo_id, private):
            # The client reads the url from the 409 answer too when called with exist_ok=True.
            raise HubError(409, f"You already created this {repo_type} repo", body={"url": url})
        self._send_json({"url": url, "name": repo_id})

    def route_delete_repo(self) -> None:
        self.server.storage.delete_repo(*self._repo_type_and_id())
        self._send_json({})

    def route_validate_yaml(self) -> None:
        self._send_json({"errors": [], "warnings": []})

    # Reading a repo

    def route_repo_info(self, rev: str = DEFAULT_BRANCH, **where: str) -> None:
        repo = self._repo(**where)
        commit = self.server.storage.resolve(repo, rev)
        with_blobs = self.query.get("blobs", ["false"])[0].lower() in ("1", "true")
        siblings = []
        for path, entry in sorted(commit.files.items()):
            sibling: dict[str, Any] = {"rfilename": path}
            if with_blobs:
                sibling |= {"size": entry.size, "blobId": entry.git_oid}
                if entry.lfs:
                    sibling["lfs"] = {
                        "size": entry.size,
                        "sha256": entry.sha256,
                        "pointerSize": entry.pointer_size,
                    }
            siblings.append(sibling)
        author = repo.repo_id.split("/")[0]
        self._send_json(
            {
                "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
                "id": repo.repo_id,
                "author": author,
                "sha": commit.oid,
                "lastModified": commit.date,
                "createdAt": repo.created,
                "private": repo.private,
                "disabled": False,
                "gated": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "siblings": siblings,
            }
        )

    def route_tree(self, rev: str, path: str = "", **where: str) -> None:
        commit = self.server.storage.resolve(self._repo(**where), rev)
        recursive = self.query.get("recursive", ["false"])[0].lower() in ("1", "true")
        folder = path.strip("/")
        prefix = f"{folder}/" if folder else ""
        if folder and (folder in commit.files or not commit.folder_exists(folder)):
            raise HubError(404, f"Folder {folder!r} does not exist at {rev}", "EntryNotFound")
        folders: set[str] = set()
        files = []
        for name, entry in sorted(commit.files.items()):
            if not name.startswith(prefix):
                continue
            parts = name[len(prefix) :].split("/")
            if recursive:
                folders.update(prefix + "/".join(parts[:depth]) for depth in range(1, len(parts)))
                files.append(entry.tree_json(name))
            elif len(parts) == 1:
                files.append(entry.tree_json(name))
            else:
                folders.add(prefix + parts[0])
        self._send_json([commit.folder_json(name) for name in sorted(folders)] + files)

    def route_paths_info(self, rev: str, **where: str) -> None:
        commit = self.server.storage.resolve(self._repo(**where), rev)
        # HfApi.get_paths_info posts a form; accept JSON as well.
        if self.headers.get("Content-Type", "").startswith("application/json"):
            paths = self._json_body().get("paths", [])
        else:
            paths = parse_qs(self.body.decode()).get("paths", [])
        found = []
        for path in (path.strip("/") for path in paths):
            if path in commit.files:
                found.append(commit.files[path].tree_json(path))
            elif commit.folder_exists(path):
                found.append(commit.folder_json(path))
        self._send_json(found)

    def route_refs(self, **where: str) -> None:
        repo = self._repo(**where)
        groups: dict[str, list[dict[str, str]]] = {
            "branches": [],
            "tags": [],
            "converts": [],
            "pullRequests": [],
        }
        for ref, oid in sorted(repo.refs.items()):
            if ref.startswith("refs/heads/"):
                group, name = "branches", ref.removeprefix("refs/heads/")
            elif ref.startswith("refs/tags/"):
                group, name = "tags", ref.removeprefix("refs/tags/")
            else:
                group, name = "pullRequests", ref
            groups[group].append({"name": name, "ref": ref, "targetCommit": oid})
        self._send_json(groups)

    def route_resolve(self, rev: str, path: str, **where: str) -> None:
        commit = self.server.storage.resolve(self._repo(**where), rev)
        entry = commit.files.get(path)
        if entry is None:
            # The client caches the miss under this commit, so the header matters here too.
            raise HubError(404, f"Entry {path!r} not found", "EntryNotFound", {"X-Repo-Commit": commit.oid})
        start, end, status = 0, entry.size - 1, 200
        headers = {"X-Repo-Commit": commit.oid, "ETag": f'"{entry.etag}"', "Accept-Ranges": "bytes"}
        if "Range" in self.headers:
            match = re.fullmatch(r"bytes=([0-9]*)-([0-9]*)", self.headers["Range"].strip())
            if match and match[1]:
                start, end = int(match[1]), min(int(match[2] or end), end)
            elif match and match[2]:
                start = max(entry.size - int(match[2]), 0)
            if not match or match[0] == "bytes=-" or start > end:
                headers["Content-Range"] = f"bytes */{entry.size}"
                raise HubError(416, f"Range not satisfiable: {self.headers['Range']}", headers=headers)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{entry.size}"
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command == "HEAD":
            return
        with self.server.storage.blob_path(entry.sha256).open("rb") as blob:
            blob.seek(start)
            remaining = end - start + 1
            while remaining > 0:
                chunk = blob.read(min(CHUNK_SIZE, remaining))
                self.wfile.write(chunk)
                remaining -= len(chunk)

    # Writing to a repo

    def route_create_branch(self, name: str, **where: str) -> None:
        repo = self._repo(**where)
        if name.startswith("refs/") or not name.strip("/"):
            raise HubError(400, f"Invalid branch name: {name}")
        start = self.server.storage.resolve(repo, self._json_body().get("startingPoint") or DEFAULT_BRANCH)
        if not self.server.storage.create_ref(repo, f"refs/heads/{name}", start.oid):
            raise HubError(409, f"Reference refs/heads/{name} already exists")
        self._send_json({})

    def route_create_tag(self, rev: str, **where: str) -> None:
        repo = self._repo(**where)
        commit = self.server.storage.resolve(repo, rev)
        tag = self._json_body()["tag"]
        if not self.server.storage.create_ref(repo, f"refs/tags/{tag}", commit.oid):
            raise HubError(409, f"Tag {tag} already exists")
        self._send_json({})

    def route_preupload(self, rev: str, **where: str) -> None:
        repo = self._repo(**where)
        # A PR starts from its target branch, which therefore has to exist too.
        commit = self.server.storage.resolve(repo, rev)
        answers = []
        for file in self._json_body()["files"]:
            path = _check_path(file["path"])
            lfs = file["size"] > 0 and is_lfs(path, file["size"], base64.b64decode(file["sample"]))
            existing = commit.files.get(path)
            # The client skips a file whose oid equals its own: sha256 for LFS, the git blob id otherwise.
            oid = None if existing is None else existing.sha256 if existing.lfs else existing.git_oid
            answers.append(
                {"path": path, "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid}
            )
        self._send_json({"files": answers, "commitOid": commit.oid})

    def route_lfs_batch(self, **where: str) -> None:
        self._repo(**where)
        body = self._json_body()
        if body.get("operation") != "upload":
            raise HubError(400, "Only LFS uploads are supported; download files through /resolve")
        objects = []
        for obj in body["objects"]:
            answer: dict[str, Any] = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            # No "actions" tells the client that the content is stored already.
            if not self.server.storage.has_blob(obj["oid"]):
                href = f"{self.server.url}/lfs-upload/{obj['oid']}/{obj['size']}"
                answer["actions"] = {"upload": {"href": href}}
            objects.append(answer)
        self._send_json(
            {"transfer": "basic", "objects": objects}, content_type="application/vnd.git-lfs+json"
        )

    def route_lfs_upload(self, oid: str, size: str) -> None:
        self.server.storage.add_lfs_object(oid, int(size), self.body)
        self._send_json({})

    def route_commit(self, rev: str, **where: str) -> None:
        repo = self._repo(**where)
        storage = self.server.storage
        header: dict[str, Any] = {}
        operations: list[Operation] = []
        for line in self.body.splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            key, value = item["key"], item["value"]
            if key == "header":
                header = value
            elif key == "file":
                content = base64.b64decode(value["content"])
                operations.append(AddFile(_check_path(value["path"]), storage.add_regular_file(content)))
            elif key == "lfsFile":
                entry = storage.lfs_entry(value["oid"], value.get("size"))
                operations.append(AddFile(_check_path(value["path"]), entry))
            elif key == "deletedFile":
                operations.append(Delete(_check_path(value["path"])))
            elif key == "deletedFolder":
                operations.append(Delete(_check_path(value["path"].rstrip("/")), folder=True))
            else:
                raise HubError(400, f"Unknown commit item: {key}")
        create_pr = self.query.get("create_pr", ["0"])[0] == "1"
        title = header.get("summary") or "Commit"
        commit, ref = storage.commit(repo, rev, title, operations, header.get("parentCommit"), create_pr)
        url = self._repo_url(repo)
        answer = {
            "success": True,
            "commitOid": commit.oid,
            "commitUrl": f"{url}/commit/{commit.oid}",
            "hookOutput": "",
        }
        if create_pr:
            answer["pullRequestUrl"] = f"{url}/discussions/{ref.removeprefix('refs/pr/')}"
        self._send_json(answer)


class HubServer(ThreadingHTTPServer):
    """The server on 127.0.0.1 and a free port, serving from a background thread until `stop()`."""

    daemon_threads = True

    def __init__(self, root: Path) -> None:
        super().__init__(("127.0.0.1", 0), HubRequestHandler)
        self.storage = HubStorage(root)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        # Every answered request, in order: lets tests check which path an upload took.
        self.requests: list[RequestRecord] = []
        self._thread = threading.Thread(target=self.serve_forever, name="hub-server", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(60)

    def __enter__(self) -> HubServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start_hub_server(root: Path) -> HubServer:
    """Start a Hub-API server storing its files under `root`; stop it with `.stop()` or a `with` block."""
    return HubServer(root)


def hub_env(server: HubServer, hf_home: Path, offline: bool = False) -> dict[str, str]:
    """Environment for a subprocess whose huggingface_hub / transformers should talk to `server`.

    The client reads these variables at import time, hence a subprocess. Every inherited HF_*,
    HUGGINGFACE_* and TRANSFORMERS_* variable is dropped so that no outer cache, token or offline
    setting leaks in; HF_TOKEN is `WRITE_TOKEN`. `offline=True` sets HF_HUB_OFFLINE=1, to check that a
    filled cache suffices.
    """
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))
    }
    env |= {
        "HF_ENDPOINT": server.url,
        "HF_HOME": str(hf_home),
        "HF_TOKEN": WRITE_TOKEN,
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",
    }
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env
