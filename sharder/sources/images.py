"""Image-folder trees as a sharder source: ``ROOT/<class>/**/<image>``, one class per folder.

Labels are positions in the sorted class-folder names (``classes[i]`` is label ``i``; the
manifest lists ``classes``). Each row holds ``image`` (binary: the file's bytes, undecoded, so
mixed sizes and formats are fine), ``label`` (int64) and ``path`` (string, relative to ROOT).
Images of a class are ordered by their path inside the class folder.

Bad input is an error naming the file: a class folder without images, a non-image file
(by extension) inside the tree, a file at ROOT's top level, or an image whose first bytes are
not those of its format (JPEG, PNG, GIF, BMP, WebP, TIFF, PNM): an unreadable or mislabelled
image is refused at sharding time rather than at training time. (Only the signature is
checked; a truncated image body is not detected.)

Opt-in skip policy (``on_bad="skip"``, ``--on-bad skip``): non-image files and images with a
bad signature inside class folders are left out, and every one is listed with its reason in
the manifest (``provenance.options.skipped``: ``[{"path", "reason"}]``, sorted by path) and
logged as a warning. A class folder left with no image is still an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from stoker.manifest import canonical_json, hash_bytes, hash_file
from stoker.sharder.errors import SharderError
from stoker.sharder.inputs import InputFile

__all__ = ["IMAGE_EXTENSIONS", "ClassFolder", "discover_classes", "hash_folder",
           "image_schema", "is_image_folder", "list_images", "read_images", "scan_images",
           "usable_images"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff",
                    ".ppm", ".pgm", ".pbm", ".pnm")
_SIGNATURES = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM",
               b"II*\x00", b"MM\x00*", b"P1", b"P2", b"P3", b"P4", b"P5", b"P6")


@dataclass(frozen=True, slots=True)
class ClassFolder(InputFile):
    """A class folder as one sharder input; ``label`` is its position among the classes,
    ``skip_bad`` the opt-in skip policy (module docstring)."""

    label: int = 0
    skip_bad: bool = False


def image_schema() -> pa.Schema:
    return pa.schema([pa.field("image", pa.binary(), False), pa.field("label", pa.int64(), False),
                      pa.field("path", pa.string(), False)])


def _hidden(name: str) -> bool:
    return name.startswith((".", "_"))


def _is_image_name(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def is_image_folder(root: str) -> bool:
    """True when ``root`` holds only (non-hidden) folders, and some of them images."""
    try:
        entries = [e for e in os.scandir(root) if not _hidden(e.name)]
    except OSError:
        return False
    if not entries or not all(e.is_dir() for e in entries):
        return False
    for entry in entries:
        for _, _, files in os.walk(entry.path):
            if any(_is_image_name(f) for f in files):
                return True
    return False


def list_images(folder: str, skipped: list[tuple[str, str]] | None = None) -> tuple[str, ...]:
    """Image paths under ``folder``, relative to it (POSIX), sorted; a non-image is an error,
    or, when a ``skipped`` list is given, appended to it as ``(path, reason)``."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not _hidden(d)]
        for name in filenames:
            if _hidden(name):
                continue
            full = os.path.join(dirpath, name)
            if not _is_image_name(name):
                if skipped is not None:
                    skipped.append((Path(os.path.relpath(full, folder)).as_posix(),
                                    "not an image (extension)"))
                    continue
                raise SharderError(f"{full!r} is not an image (extension not one of "
                                   f"{', '.join(IMAGE_EXTENSIONS)}) but lies in class folder "
                                   f"{folder!r}; move it out of the tree or rename it.")
            found.append(Path(os.path.relpath(full, folder)).as_posix())
    return tuple(sorted(found))


def discover_classes(root: str, skip_bad: bool = False) -> list[ClassFolder]:
    """One :class:`ClassFolder` per class, sorted by name, labels 0..C-1.

    Raises:
        SharderError: a file at the top level, a class folder without images.
    """
    classes = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if _hidden(entry.name):
            continue
        if not entry.is_dir():
            raise SharderError(f"{entry.path!r} is a file at the top of image folder {root!r}; "
                               "images must sit in one folder per class. Move it into a class "
                               "folder or out of the tree.")
        images = usable_images(entry.path, skip_bad)[0]
        if not images:
            raise SharderError(f"class folder {entry.path!r} holds no images; add images or "
                               "remove the folder (its class would have no samples).")
        st = os.stat(entry.path)
        size = sum(os.stat(os.path.join(entry.path, p)).st_size for p in images)
        classes.append(ClassFolder(os.path.abspath(entry.path), entry.name, "imagefolder", size,
                                   st.st_mtime_ns, (), len(classes), skip_bad))
    if not classes:
        raise SharderError(f"image folder {root!r} has no class folders; expected "
                           "ROOT/<class>/<image> files.")
    return classes


def _signature_ok(data: bytes) -> bool:
    return data.startswith(_SIGNATURES) or (data[:4] == b"RIFF" and data[8:12] == b"WEBP")


def usable_images(folder: str, skip_bad: bool) -> tuple[tuple[str, ...], list[tuple[str, str]]]:
    """The images of a class folder that are kept, and (with ``skip_bad``) those skipped.

    Without ``skip_bad`` the kept list is every image and nothing is read; with it, each
    image's signature is read (16 bytes), so the same files are kept on every call.
    """
    if not skip_bad:
        return list_images(folder), []
    skipped: list[tuple[str, str]] = []
    kept = []
    for rel in list_images(folder, skipped):
        with open(os.path.join(folder, rel), "rb") as f:
            head = f.read(16)
        if _signature_ok(head):
            kept.append(rel)
        else:
            skipped.append((rel, f"not a readable image (first bytes {head[:8]!r})"))
    return tuple(kept), sorted(skipped)


def _check_signature(path: str, data: bytes) -> None:
    if not _signature_ok(data):
        raise SharderError(f"{path!r} is not a readable image: its first bytes {data[:8]!r} are "
                           "not a JPEG, PNG, GIF, BMP, WebP, TIFF or PNM signature. Replace or "
                           "remove the file.")


def scan_images(folder: ClassFolder) -> int:
    """Images in the class folder, each signature-checked."""
    images = usable_images(folder.path, folder.skip_bad)[0]
    for rel in images:
        full = os.path.join(folder.path, rel)
        with open(full, "rb") as f:
            _check_signature(full, f.read(16))
    return len(images)


def read_images(folder: ClassFolder, columns: list[str], start: int, stop: int) -> pa.Table:
    """Images ``[start, stop)`` of the class folder as a table of ``columns``."""
    images = usable_images(folder.path, folder.skip_bad)[0][start:stop]
    blobs = []
    for rel in images:
        full = os.path.join(folder.path, rel)
        data = Path(full).read_bytes()
        _check_signature(full, data)
        blobs.append(data)
    values = {"image": pa.array(blobs, pa.binary()),
              "label": pa.array([folder.label] * len(images), pa.int64()),
              "path": pa.array([f"{folder.rel}/{p}" for p in images], pa.string())}
    schema = image_schema()
    return pa.Table.from_arrays([values[c] for c in columns],
                                schema=pa.schema([schema.field(c) for c in columns]))


def hash_folder(folder: str) -> tuple[str, int]:
    """Provenance hash of a class folder: xxh3-128 of the canonical JSON list of
    ``[path, bytes, xxh3_128]`` of its files with image extensions (sorted; images skipped
    for a bad signature included, so the hash describes the folder as it was), and their
    total size."""
    entries = []
    for rel in list_images(folder, []):
        digest, size = hash_file(os.path.join(folder, rel))
        entries.append([rel, size, digest])
    return hash_bytes(canonical_json(entries)), sum(e[1] for e in entries)
