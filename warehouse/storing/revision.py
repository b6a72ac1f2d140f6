"""A local checkpoint's digest revision against the warehouse: hashed while its layers are read, or first.

A folder or GGUF file without a commit is named by a digest of its headers and the tensors a run reads
(extract.formats.provenance.Digest). A model the warehouse does not hold yet is stored under the digest's
`pending` name and gets the digest once its layers are read, so the first extraction reads each byte
once; a model it holds under another revision is hashed before the run, to compare.
"""
from __future__ import annotations

from headforms.warehouse.storing.store import transaction


def prepare(con, ckpts) -> None:
    """Before planning: defer the digest of each checkpoint the warehouse does not hold under another revision
    (it is hashed as read); a stored pending name whose digest is now known (a run cut short after its last
    layer was read) gets it, so the same command goes on."""
    for ckpt in ckpts:
        digest = ckpt.digest
        if digest is None:
            continue
        stored = con.execute("SELECT revision FROM models WHERE model = ?", [ckpt.name]).fetchall()
        if stored and stored[0][0] == digest.pending and digest.known:
            with transaction(con):
                con.execute("UPDATE models SET revision = ? WHERE model = ? AND revision = ?",
                            [digest.value, ckpt.name, digest.pending])
        elif not stored or stored[0][0] == digest.pending:
            digest.defer()


def record(writer, ckpt) -> None:
    """After a model's layers: its pending name becomes the digest (hashing the tensors this process did not
    read: those read by workers, or by an earlier run of the same files)."""
    if ckpt.digest is None or not ckpt.digest.deferred:
        return
    pending, revision = ckpt.digest.pending, ckpt.digest.settle()
    with writer.connection() as con, transaction(con):
        con.execute("UPDATE models SET revision = ? WHERE model = ? AND revision = ?", [revision, ckpt.name, pending])
