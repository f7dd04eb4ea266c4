"""Pure helpers of the controlled restart (no JVM): state re-keying, source start, checkpoints,
the versions a generation follows live, the routing log and uncommitted batches."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from rebalance.core.placement import default_instances
from rebalance.streaming import restart
from rebalance.streaming.processor import INITIAL_STATE_DDL, PERKEY, PERWINDOW
from rebalance.streaming.restart import checkpoint as restart_checkpoint
from rebalance.streaming.restart import sink as restart_sink
from rebalance.streaming.restart import state as restart_state
from rebalance.streaming.routing import instance_labels

COLUMNS = [c.split()[0] for c in INITIAL_STATE_DDL.split(", ")]


def _state(keys, n, windows=(0, 10_000)):
    labels = instance_labels(n)
    rows = []
    for i, key in enumerate(keys):
        d = int(default_instances([key], n)[0])
        rows.append({"label": labels[d], "kind": PERKEY, "key": key, "key_group": i,
                     "default_instance": d, "version": 0, "windows": list(windows),
                     "counts": [i + 1, 1], "sums": [float(i), 1.0], "costs": [1.0, 2.0]})
    for instance in range(n):
        rows.append({"label": labels[instance], "kind": PERWINDOW, "window_start_ms": windows[-1],
                     "events": 0, "load": 0.0, "task_ns": 100 * (instance + 1),
                     "cpu_ns": 10, "version": 0})
    return pd.DataFrame(rows).reindex(columns=COLUMNS)


def test_moved_keys_change_label_and_unmoved_keys_are_copied_unchanged():
    keys = [f"k{i}" for i in range(20)]
    state = _state(keys, 3)
    routing = {"k1": (int(default_instances(["k1"], 3)[0]) + 1) % 3}
    out = restart_state.migrate_state(state, 3, 3, routing, version=7)
    before = state[state.kind == PERKEY].set_index("key")
    after = out[out.kind == PERKEY].set_index("key")
    assert set(after.index) == set(keys)
    assert after.loc["k1", "label"] == instance_labels(3)[routing["k1"]]
    for key in keys[2:]:
        for column in ("label", "key_group", "default_instance", "version", "windows",
                       "counts", "sums", "costs"):
            assert after.loc[key, column] == before.loc[key, column], (key, column)


def test_open_windows_get_the_totals_of_the_keys_each_instance_now_holds():
    keys = [f"k{i}" for i in range(30)]
    state = _state(keys, 2)
    out = restart_state.migrate_state(state, 2, 4, {}, version=3)
    perkey = out[out.kind == PERKEY]
    labels4 = instance_labels(4)
    assert (perkey["default_instance"].to_numpy() == default_instances(keys, 4)).all()
    assert (perkey["label"].to_numpy()
            == np.array(labels4)[default_instances(keys, 4)]).all()
    windows = out[out.kind == PERWINDOW]
    assert set(windows["window_start_ms"]) == {10_000}        # only the open window
    assert windows["events"].sum() == len(keys)                 # one event per key in it
    assert windows["load"].sum() == pytest.approx(2.0 * len(keys))
    assert (windows["version"] == 3).all()


def test_a_key_held_by_two_labels_is_merged():
    state = _state(["a"], 2)
    twin = state[state.kind == PERKEY].copy()
    twin["label"] = [instance_labels(2)[1 - int(twin["default_instance"].iloc[0])]]
    twin["windows"], twin["counts"] = [[10_000]], [[5]]
    twin["sums"], twin["costs"] = [[5.0]], [[5.0]]
    out = restart_state.migrate_state(pd.concat([state, twin], ignore_index=True), 2, 2, {}, 1)
    (row,) = out[out.kind == PERKEY].itertuples()
    assert list(row.windows) == [0, 10_000] and list(row.counts) == [1, 6]


def test_source_starts_after_the_last_processed_file(monkeypatch):
    files = {4: ["a", "b", "c"], 5: ["d"]}
    monkeypatch.setattr(restart_checkpoint, "version_files", lambda spark, path, v: files[v])
    offset = {"reservoirVersion": 5, "index": -1, "isStartingVersion": False}
    assert restart_checkpoint.source_after(None, "t", offset) == {
        "starting_version": 4, "exclude_files": ["a", "b", "c"]}
    offset = {"reservoirVersion": 4, "index": 1, "isStartingVersion": False}
    assert restart_checkpoint.source_after(None, "t", offset) == {
        "starting_version": 4, "exclude_files": ["a", "b"]}
    with pytest.raises(restart.RestartError, match="initial snapshot"):
        restart_checkpoint.source_after(None, "t", {**offset, "isStartingVersion": True})


def test_checkpoint_position_reads_the_last_committed_batch(tmp_path):
    for folder in ("offsets", "commits"):
        (tmp_path / folder).mkdir()
    offset = {"reservoirVersion": 9, "index": 0, "isStartingVersion": False}
    for b in range(3):
        (tmp_path / "offsets" / str(b)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n'
                                                   f'{json.dumps(offset)}\n')
    for b in range(2):
        (tmp_path / "commits" / str(b)).write_text('v1\n{"nextBatchWatermarkMs":1234}\n')
    pos = restart.checkpoint_position(str(tmp_path))
    assert (pos.last_batch, pos.offset, pos.next_watermark_ms, pos.uncommitted) == (
        1, offset, 1234, True)


def _checkpoint(root, offsets, commits):
    for folder in ("offsets", "commits"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    for b in range(offsets):
        (root / "offsets" / str(b)).write_text('v1\n{}\n{"reservoirVersion":1,"index":0}\n')
        (root / "offsets" / f".{b}.crc").write_text("")
    for b in range(commits):
        (root / "commits" / str(b)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def test_uncommitted_batches_that_wrote_nothing_are_dropped(tmp_path):
    _checkpoint(tmp_path, offsets=5, commits=3)
    assert restart_checkpoint.drop_uncommitted(str(tmp_path), written={1, 2}) == [3, 4]
    assert sorted(p.name for p in (tmp_path / "offsets").iterdir()) == [
        ".0.crc", ".1.crc", ".2.crc", "0", "1", "2"]
    assert not restart.checkpoint_position(str(tmp_path)).uncommitted
    assert restart_checkpoint.drop_uncommitted(str(tmp_path), written=set()) == []


def test_the_state_partitions_are_those_the_newest_committed_batch_recorded(tmp_path):
    assert restart_checkpoint.checkpoint_partitions(str(tmp_path)) is None   # no batch yet
    _checkpoint(tmp_path, offsets=2, commits=2)
    assert restart_checkpoint.checkpoint_partitions(str(tmp_path)) is None   # no conf
    for batch, n in ((2, 3), (10, 4), (11, 2)):  # batch 10 after 9: the numeric order counts
        (tmp_path / "offsets" / str(batch)).write_text(
            'v1\n{"batchWatermarkMs":0,"conf":{"spark.sql.shuffle.partitions":"%d"}}\n'
            '{"reservoirVersion":1,"index":0}\n' % n)
    for batch in (2, 10):
        (tmp_path / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    # batch 11 (a repartition to 2 whose driver died) is not committed: it does not count
    assert restart_checkpoint.checkpoint_partitions(str(tmp_path)) == 4
    (tmp_path / "commits" / "11").write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    assert restart_checkpoint.checkpoint_partitions(str(tmp_path)) == 2


def test_an_uncommitted_batch_that_may_have_written_is_not_dropped(tmp_path):
    _checkpoint(tmp_path, offsets=4, commits=3)
    with pytest.raises(restart.RestartError, match="replay them first"):
        restart_checkpoint.drop_uncommitted(str(tmp_path), written={3})
    assert (tmp_path / "offsets" / "3").exists()


def test_the_version_in_force_comes_from_the_routing_log_of_committed_batches(tmp_path):
    checkpoint = str(tmp_path / "keyed-g1")
    gen = restart.Generation(1, 4, 3, checkpoint, start_batch=5, in_place=True)
    assert restart_checkpoint.in_force_version(gen, None) == 4            # nothing committed
    log = restart_checkpoint.routing_log(checkpoint)
    log.mkdir()
    for batch, version in ((2, 3), (7, 6), (9, 8)):          # batch 2: the generation before
        (log / str(batch)).write_text(json.dumps({"assignment_version": version}))
    assert restart_checkpoint.in_force_version(gen, 6) == 4               # own version until batch 7
    assert restart_checkpoint.in_force_version(gen, 8) == 6
    assert restart_checkpoint.in_force_version(gen, 20) == 8


def test_a_generation_does_not_follow_versions_for_a_restart_or_another_n():
    assert not restart_sink.blocks({"apply_mode": "broadcast", "n_instances": 3}, 3)
    assert not restart_sink.blocks({"action": "rollback", "n_instances": 3}, 3)
    assert restart_sink.blocks({"apply_mode": "restart", "n_instances": 3}, 3)
    assert restart_sink.blocks({"apply_mode": "broadcast", "n_instances": 4}, 3)
    meta = {2: {"n_instances": 3}, 5: {"apply_mode": "restart", "n_instances": 3},
            6: {"n_instances": 4}, 7: {"apply_mode": "broadcast", "n_instances": 3},
            8: {"n_instances": 3}}
    guard = restart_sink.VersionGuard(None, None, 3, in_force=2, requested={8}, metadata=meta)
    guard._refresh = lambda: None
    assert guard.blocked_versions() == [5, 6, 8]
    assert guard.followable(2) and guard.followable(7)
    assert not guard.followable(1)                             # older than the one in force
    assert not any(guard.followable(v) for v in (5, 6, 8))


def test_the_batch_that_took_the_export_is_found_by_the_handoff_offset(tmp_path):
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    handoff = [None, (0, -1), (0, -1), (3, -1), (3, 0), (4, -1)]  # per batch; export: version 3
    for b, offset in enumerate(handoff):
        second = "-" if offset is None else json.dumps(
            {"reservoirVersion": offset[0], "index": offset[1], "isStartingVersion": False})
        (tmp_path / "offsets" / str(b)).write_text(
            f'v1\n{{}}\n{{"reservoirVersion":1,"index":0}}\n{second}\n')
        if b < 5:
            (tmp_path / "commits" / str(b)).write_text("v1\n{}\n")
    assert restart_checkpoint.covering_batch(str(tmp_path), 3) == 4
    assert restart_checkpoint.covering_batch(str(tmp_path), 2) == 3   # (3, -1): 2 is done
    assert restart_checkpoint.covering_batch(str(tmp_path), 4) is None  # batch 5: uncommitted
