"""The report API: every line a fix logs about what it did carries its fix and its kind on the LogRecord, and the
job report files the line by that kind, never by its text; one INFO line per engine, then DEBUG."""

import logging

import pytest

from nrl_shim import job_report, report


@pytest.fixture
def records():
    """The `nrl_shim` logger's records, DEBUG included."""
    log = report.logger()
    caught: list[logging.LogRecord] = []
    handler = logging.Handler(level=logging.DEBUG)
    handler.emit = caught.append  # type: ignore[method-assign]
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    yield caught
    log.removeHandler(handler)
    log.setLevel(level)


def tagged(record):
    return job_report.quirk_of(record, record.getMessage()), job_report.kind_of(record), record.levelname


def test_each_helper_gives_its_record_the_fix_and_kind(records):
    report.changed("rep-a", "setting", 1, 2, "why")
    report.changed("rep-a", "setting", 1, 2, "why")  # once per process
    report.unchanged("rep-a", "thing", "already right")
    report.warn_once("rep-a", "k", "[rep-a] careful")
    report.warn_once("rep-a", "u", "[rep-a] acts on an unverified release: x", kind="unverified")
    report.record("rep-a", "skipped", "[rep-a] fix skipped: %s", "reason")
    report.record(None, "warning", "a line of the shim's shared parts")
    assert [tagged(r) for r in records] == [
        ("rep-a", "changed", "INFO"),
        ("rep-a", "unchanged", "INFO"),
        ("rep-a", "warning", "WARNING"),
        ("rep-a", "unverified", "WARNING"),
        ("rep-a", "skipped", "WARNING"),
        (None, "warning", "WARNING"),
    ]
    assert records[0].getMessage() == "[rep-a] setting: 1 -> 2 (why)"  # the text people read is as before


def test_a_line_logged_without_a_kind_is_filed_by_its_level_never_its_text(records):
    log = report.logger()
    log.info("[plugin-fix] looks like a change: 1 -> 2")  # a plugin calling logging itself
    log.warning("[plugin-fix] nothing to change (but at WARNING)")
    log.error("[plugin-fix] fix skipped: not really")
    assert [tagged(r) for r in records] == [
        ("plugin-fix", "info", "INFO"),
        ("plugin-fix", "warning", "WARNING"),
        ("plugin-fix", "error", "ERROR"),
    ]


def test_first_at_info_says_each_key_once_per_engine_at_info_then_debug(records):
    engine_a, engine_b = set(), set()  # what each engine's state keeps
    said = [
        report.first_at_info(engine_a, "reset", "rep-b", "changed", "[%s] reset #%d", "rep-b", 1),
        report.first_at_info(engine_a, "reset", "rep-b", "changed", "[%s] reset #%d", "rep-b", 2),
        report.first_at_info(engine_a, "drop", "rep-b", "changed", "[%s] drop", "rep-b"),
        report.first_at_info(engine_b, "reset", "rep-b", "changed", "[%s] reset #%d", "rep-b", 1),
        report.first_at_info(engine_b, "reset", "rep-b", "changed", "[%s] first", "rep-b", later=("short %d", 2)),
    ]
    assert said == [True, False, True, True, False]
    assert [(r.getMessage(), r.levelname, job_report.kind_of(r)) for r in records] == [
        ("[rep-b] reset #1", "INFO", "changed"),
        ("[rep-b] reset #2", "DEBUG", "changed"),
        ("[rep-b] drop", "INFO", "changed"),
        ("[rep-b] reset #1", "INFO", "changed"),
        ("short 2", "DEBUG", "changed"),
    ]


def test_the_job_report_files_each_line_by_the_kind_on_its_record(tmp_path, monkeypatch):
    monkeypatch.setenv(job_report.VARIABLE, str(tmp_path))
    monkeypatch.delenv("NRL_SHIM", raising=False)
    recorder = job_report.Recorder()
    log = report.logger()
    log.addHandler(recorder)
    try:
        report.changed("rep-c", "setting", "a", "b", "why")
        report.unchanged("rep-c", "other", "already right")
        log.info("[rep-c] state: on -> off, said by hand")  # no kind on the record: not a change
        report.first_at_info(set(), "k", "rep-c", "changed", "[rep-c] a change with no arrow in its text")
    finally:
        log.removeHandler(recorder)
    (name,) = job_report.read_directory(str(tmp_path))
    process = job_report.parse(name, job_report.read_directory(str(tmp_path))[name], "local")
    assert [(r["quirk"], r["kind"]) for r in process["records"]] == [
        ("rep-c", "changed"),
        ("rep-c", "unchanged"),
        ("rep-c", "info"),
        ("rep-c", "changed"),
    ]
    summary = job_report.summarize([process])["rep-c"]
    assert [m for _, m in summary["changed"]] == ["[rep-c] setting: 'a' -> 'b' (why)"]  # each process once per kind
