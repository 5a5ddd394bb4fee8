"""Row storage: the ingested matrix in .npy chunks inside the database. Rows are never returned.

Keeping the rows in the database makes an upload one transaction (no partial dataset on a
failure) and lets every server process read them.
"""

from __future__ import annotations

import io

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import Engine, delete, select
from sqlalchemy.orm import Session

from service.db.models import DatasetChunk

CHUNK_BYTES = 8 * 1024 * 1024


def save_matrix(session: Session, *, dataset_id: str, matrix: NDArray[np.float64]) -> None:
    buf = io.BytesIO()
    np.save(buf, matrix, allow_pickle=False)
    view = buf.getbuffer()
    for index, start in enumerate(range(0, len(view), CHUNK_BYTES)):
        session.add(
            DatasetChunk(
                dataset_id=dataset_id,
                chunk_index=index,
                data=bytes(view[start : start + CHUNK_BYTES]),
            )
        )
        if index % 4 == 3:
            session.flush()
    del view
    session.flush()


def load_matrix(session: Session, *, dataset_id: str) -> NDArray[np.float64]:
    buf = io.BytesIO()
    for (data,) in session.execute(
        select(DatasetChunk.data)
        .where(DatasetChunk.dataset_id == dataset_id)
        .order_by(DatasetChunk.chunk_index)
    ):
        buf.write(data)
    buf.seek(0)
    matrix: NDArray[np.float64] = np.load(buf, allow_pickle=False)
    return matrix


def delete_rows(session: Session, *, dataset_id: str) -> None:
    """Delete the stored chunks. On SQLite ``secure_delete`` (set on every write connection,
    service.db.engine) overwrites the freed pages; PostgreSQL keeps dead rows until VACUUM
    (autovacuum, docs: guide-owner "Deleting rows")."""
    session.execute(delete(DatasetChunk).where(DatasetChunk.dataset_id == dataset_id))


def checkpoint_log(session: Session) -> None:
    """SQLite only, outside any transaction: write the write-ahead log back into the database
    file and truncate it, so the pages a deletion overwrote leave the log too."""
    bind = session.get_bind()
    if bind.dialect.name != "sqlite" or not isinstance(bind, Engine):
        return
    raw = bind.raw_connection()
    try:
        raw.cursor().execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        raw.close()
