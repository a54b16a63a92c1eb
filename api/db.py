"""The persistent store's schema and its migrations (SQLAlchemy Core; SQLite and PostgreSQL).

Migrations are numbered functions run in order inside one transaction each, recorded in
`recycle_schema`. They use only portable DDL so one code path serves both databases. PostgreSQL
serializes concurrent migrators with an advisory lock; SQLite with `BEGIN IMMEDIATE`.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import (
    Column,
    Engine,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    inspect,
    text,
)
from sqlalchemy.engine import Connection

metadata = MetaData()

jobs = Table(
    "jobs", metadata,
    Column("id", String(32), primary_key=True),
    Column("spec", Text, nullable=False, comment="the job spec JSON, defaults filled in"),
    Column("pipelines", Integer, nullable=False),
    Column("stages", Integer, nullable=False),
    Column("microbatches", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
)

# One row per (job, canonical failure class): the solve is shared by every concrete failure set of
# the class, and the stored timeline is the canonical plan (pipelines relabelled per request).
solves = Table(
    "solves", metadata,
    Column("job_id", String(32), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("class_key", String(512), primary_key=True),
    Column("status", String(16), nullable=False, comment="pending | done | failed"),
    Column("summary", Text, nullable=True),
    Column("timeline", Text, nullable=True),
    Column("error", Text, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("solved_at", Float, nullable=True),
)

# A plan resource: one concrete failure set of a job, pointing at its class's solve.
plans = Table(
    "plans", metadata,
    Column("id", String(32), primary_key=True),
    Column("job_id", String(32), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("failed_key", String(512), nullable=False),
    Column("class_key", String(512), nullable=False),
    Column("created_at", Float, nullable=False),
    UniqueConstraint("job_id", "failed_key", name="uq_plans_job_failed"),
)

# No foreign key to jobs (schema v3): an operation outlives its job's delete, as `cancelled`, so a
# client polling it learns why it stopped instead of getting a 404.
operations = Table(
    "operations", metadata,
    Column("id", String(32), primary_key=True),
    Column("job_id", String(32), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("max_failures", Integer, nullable=False),
    Column("status", String(16), nullable=False, comment="running | done | cancelled | failed"),
    Column("total", Integer, nullable=False),
    Column("done", Integer, nullable=False),
    Column("error", Text, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

memberships = Table(
    "memberships", metadata,
    Column("job_id", String(32), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("generation", Integer, nullable=False),
    Column("failed", Text, nullable=False, comment="JSON list of [pipeline, stage]"),
    Column("plan_id", String(32), nullable=True),
    Column("status", String(16), nullable=False, comment="solving | running | waiting | stopped"),
    Column("reason", Text, nullable=True),
    Column("updated_at", Float, nullable=False),
)

registrations = Table(
    "registrations", metadata,
    Column("job_id", String(32), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("pipeline", Integer, primary_key=True),
    Column("stage", Integer, primary_key=True),
    Column("address", String(256), nullable=True),
    Column("pid", Integer, nullable=True),
    Column("registered_at", Float, nullable=False),
    Column("session_sha256", String(64), nullable=True,
           comment="hash of the registration id handed to the process that registered (schema v5)"),
)

# POST /v1/jobs with an `Idempotency-Key`: the key, the job it created and a hash of the request, so a
# retry (same key, same body) answers the same job and a reuse with another body is refused. No
# foreign key (schema v7): a key outlives its job's delete, so a late retry cannot make a second job.
idempotency_keys = Table(
    "idempotency_keys", metadata,
    Column("key", String(255), primary_key=True),
    Column("job_id", String(32), nullable=False),
    Column("request_sha256", String(64), nullable=False),
    Column("created_at", Float, nullable=False),
)

# Where a job's worker daemons meet: the c10d store's HOST:PORT, registered by `recycle rendezvous
# --service` (schema v6) so workers need no --store flag.
rendezvous = Table(
    "rendezvous", metadata,
    Column("job_id", String(32), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("address", String(256), nullable=False),
    Column("updated_at", Float, nullable=False),
)

schema_table = Table("recycle_schema", MetaData(), Column("version", Integer, nullable=False))


def _index(conn: Connection, name: str, table: str, column: str) -> None:
    """Plain DDL: an `Index` object would attach itself to the Table, and a later `create_all` in the
    same process (a second database migrated from v0) would then create it twice."""
    conn.execute(text(f"CREATE INDEX {name} ON {table} ({column})"))


def _v1_initial(conn: Connection) -> None:
    metadata.create_all(conn, tables=[jobs, solves, plans, operations, memberships, registrations])


def _v2_indexes(conn: Connection) -> None:
    _index(conn, "ix_plans_job", "plans", "job_id")
    _index(conn, "ix_operations_job", "operations", "job_id")


def _rebuild(conn: Connection, table: Table, columns_ddl: str, index: str) -> None:
    """Re-create `table` from `columns_ddl` with its rows and its job_id index (portable: SQLite
    cannot drop a constraint, so dropping a foreign key is a rebuild)."""
    conn.execute(text(f"CREATE TABLE {table.name}_new ({columns_ddl})"))
    columns = ", ".join(c.name for c in table.columns)
    conn.execute(text(f"INSERT INTO {table.name}_new ({columns}) SELECT {columns} FROM {table.name}"))
    conn.execute(text(f"DROP TABLE {table.name}"))
    conn.execute(text(f"ALTER TABLE {table.name}_new RENAME TO {table.name}"))
    _index(conn, index, table.name, "job_id")


def _v3_operations_outlive_jobs(conn: Connection) -> None:
    """Rebuild `operations` without its foreign key."""
    _rebuild(conn, operations, "id VARCHAR(32) NOT NULL PRIMARY KEY, job_id VARCHAR(32) NOT NULL, "
             "kind VARCHAR(32) NOT NULL, max_failures INTEGER NOT NULL, status VARCHAR(16) NOT NULL, "
             "total INTEGER NOT NULL, done INTEGER NOT NULL, error TEXT, created_at FLOAT NOT NULL, "
             "updated_at FLOAT NOT NULL", "ix_operations_job")


def _v4_idempotency_keys(conn: Connection) -> None:
    metadata.create_all(conn, tables=[idempotency_keys])
    _index(conn, "ix_idempotency_job", "idempotency_keys", "job_id")


def _v5_registration_sessions(conn: Connection) -> None:
    """Bind a registration to its process (a database made at v1 by this code already has it)."""
    if "session_sha256" not in {c["name"] for c in inspect(conn).get_columns("registrations")}:
        conn.execute(text("ALTER TABLE registrations ADD COLUMN session_sha256 VARCHAR(64)"))


def _v6_rendezvous(conn: Connection) -> None:
    metadata.create_all(conn, tables=[rendezvous])


def _v7_keys_outlive_jobs(conn: Connection) -> None:
    """Rebuild `idempotency_keys` without its foreign key: a deleted job's key stays bound to it, so
    a retry arriving after the delete is refused, not a new job."""
    _rebuild(conn, idempotency_keys, "key VARCHAR(255) NOT NULL PRIMARY KEY, job_id VARCHAR(32) NOT NULL, "
             "request_sha256 VARCHAR(64) NOT NULL, created_at FLOAT NOT NULL", "ix_idempotency_job")


MIGRATIONS: list[tuple[int, Callable[[Connection], None]]] = [
    (1, _v1_initial), (2, _v2_indexes), (3, _v3_operations_outlive_jobs), (4, _v4_idempotency_keys),
    (5, _v5_registration_sessions), (6, _v6_rendezvous), (7, _v7_keys_outlive_jobs)]
SCHEMA_VERSION = MIGRATIONS[-1][0]


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False},
                               pool_size=8, max_overflow=8)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # WAL: readers never wait for the writer
            dbapi_conn.isolation_level = None  # let SQLAlchemy's BEGIN below be the only one
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn):  # writers take the lock up front: no deadlocking lock upgrades
            immediate = conn.get_execution_options().get("immediate")
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine
    return create_engine(url, pool_size=10, max_overflow=20, pool_pre_ping=True)


def migrate(engine: Engine) -> int:
    """Bring the schema to `SCHEMA_VERSION`; safe to call from several processes at once."""
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(74737001)"))
        schema_table.create(conn, checkfirst=True)
        current = conn.execute(schema_table.select()).scalar()
        if current is None:
            conn.execute(schema_table.insert().values(version=0))
            current = 0
        for version, step in MIGRATIONS:
            if version > current:
                step(conn)
                conn.execute(schema_table.update().values(version=version))
                current = version
        return current
