#!/usr/bin/env python3
"""Checks loco's TensorBoard event files without loco's code or TensorBoard.

Usage: tb_events.py RUN_DIR [REFERENCE_RUN_DIR]

Reads every events.out.tfevents.* file of RUN_DIR in name order, checks each TFRecord's two
masked CRC-32C (computed here bit by bit), decodes the Event protocol buffers with python3-protobuf
from a schema declared below (the subset of TensorFlow's event.proto and summary.proto that
TensorBoard reads for scalars), applies TensorBoard's rule for a SessionLog START (events of
earlier files past its step are dropped), and compares the scalars with the run's metrics.jsonl
and the reporter's series in summary.json. With REFERENCE_RUN_DIR, the train and val loss
curves must also equal that run's (an uninterrupted run of the same config).
"""
import glob
import json
import math
import os
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def schema():
    f = descriptor_pb2.FileDescriptorProto(name="loco_test_event.proto", package="tbtest", syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto

    def msg(name, fields, oneof=None):
        m = f.message_type.add(name=name)
        if oneof:
            m.oneof_decl.add(name=oneof)
        for num, fname, ftype, label, tname, in_oneof in fields:
            fd = m.field.add(name=fname, number=num, type=ftype, label=label)
            if tname:
                fd.type_name = tname
            if in_oneof:
                fd.oneof_index = 0
        return m

    opt, rep = T.LABEL_OPTIONAL, T.LABEL_REPEATED
    msg("Value", [(1, "tag", T.TYPE_STRING, opt, None, False), (2, "simple_value", T.TYPE_FLOAT, opt, None, True)],
        oneof="value")
    msg("Summary", [(1, "value", T.TYPE_MESSAGE, rep, ".tbtest.Value", False)])
    log = msg("SessionLog", [(1, "status", T.TYPE_ENUM, opt, ".tbtest.SessionLog.Status", False),
                             (2, "checkpoint_path", T.TYPE_STRING, opt, None, False),
                             (3, "msg", T.TYPE_STRING, opt, None, False)])
    st = log.enum_type.add(name="Status")
    for i, n in enumerate(["STATUS_UNSPECIFIED", "START", "STOP", "CHECKPOINT"]):
        st.value.add(name=n, number=i)
    msg("Event", [(1, "wall_time", T.TYPE_DOUBLE, opt, None, False), (2, "step", T.TYPE_INT64, opt, None, False),
                  (3, "file_version", T.TYPE_STRING, opt, None, True),
                  (5, "summary", T.TYPE_MESSAGE, opt, ".tbtest.Summary", True),
                  (6, "session_log", T.TYPE_MESSAGE, opt, ".tbtest.SessionLog", True)], oneof="what")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    desc = pool.FindMessageTypeByName("tbtest.Event")
    get = getattr(message_factory, "GetMessageClass", None)
    return get(desc) if get else message_factory.MessageFactory(pool).GetPrototype(desc)


def read_records(path):
    raw = open(path, "rb").read()
    pos, out = 0, []
    while pos < len(raw):
        assert pos + 12 <= len(raw), f"{path}: truncated header at {pos}"
        header = raw[pos:pos + 8]
        (n,) = struct.unpack("<Q", header)
        (hc,) = struct.unpack("<I", raw[pos + 8:pos + 12])
        assert hc == masked(header), f"{path}: bad length CRC at {pos}"
        data = raw[pos + 12:pos + 12 + n]
        assert len(data) == n, f"{path}: truncated record at {pos}"
        (dc,) = struct.unpack("<I", raw[pos + 12 + n:pos + 16 + n])
        assert dc == masked(data), f"{path}: bad data CRC at {pos}"
        out.append(data)
        pos += 16 + n
    return out


def scalars(run):
    Event = schema()
    files = sorted(glob.glob(os.path.join(run, "events.out.tfevents.*")))
    assert files, f"{run}: no event files"
    series, records = {}, 0
    for path in files:
        events = []
        for data in read_records(path):
            e = Event()
            e.ParseFromString(data)
            assert e.SerializeToString() == data, f"{path}: record is not exactly one Event"
            events.append(e)
            records += 1
        assert events[0].file_version == "brain.Event:2", f"{path}: first event is not the file version"
        assert events[0].wall_time > 1.6e9, f"{path}: wall time {events[0].wall_time}"
        for e in events[1:]:
            if e.WhichOneof("what") == "session_log":
                assert e.session_log.status == 1, "only START session logs are written"
                for tag in series:  # TensorBoard's purge of orphaned data
                    series[tag] = [(s, v) for s, v in series[tag] if s <= e.step]
            else:
                assert e.WhichOneof("what") == "summary", f"{path}: unexpected event {e}"
                for v in e.summary.value:
                    series.setdefault(v.tag, []).append((e.step, v.simple_value))
    return series, records, len(files)


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def main():
    run = sys.argv[1]
    series, records, nfiles = scalars(run)
    metrics = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if l.strip()]
    summary = json.load(open(os.path.join(run, "summary.json")))
    reporter = max(summary["workers"], key=lambda w: (w["stage"], -w["replica"]))
    points = {p["step"]: p for p in reporter["series"]}

    def check(tag, expected):
        got = series.get(tag, [])
        assert [s for s, _ in got] == [s for s, _ in expected], f"{tag}: steps {[s for s, _ in got]} != {[s for s, _ in expected]}"
        for (s, v), (_, x) in zip(got, expected):
            assert v == f32(x), f"{tag} at step {s}: {v} != {f32(x)}"
        return len(got)

    n = check("loss/train", [(m["step"], m["train_loss"]) for m in metrics])
    check("loss/val", [(m["step"], m["val_loss"]) for m in metrics if "val_loss" in m])
    check("optimizer/lr", [(m["step"], m["lr"]) for m in metrics])
    check("optimizer/grad_norm", [(m["step"], m["grad_norm"]) for m in metrics])
    check("network/compute_utilization", [(m["step"], points[m["step"]]["compute_utilization"]) for m in metrics])
    prev = 0
    per_step = []
    for m in metrics:
        per_step.append((m["step"], points[m["step"]]["bytes_sent"] / (m["step"] - prev)))
        prev = m["step"]
    check("network/bytes_sent_per_step", per_step)
    tps = series["throughput/tokens_per_s"]
    assert len(tps) == n and all(v > 0 and math.isfinite(v) for _, v in tps), "tokens/s"
    if len(sys.argv) > 2:
        ref, _, _ = scalars(sys.argv[2])
        for tag in ("loss/train", "loss/val"):
            assert series[tag] == ref[tag], f"{tag} differs from the uninterrupted run"
    print(f"{nfiles} event file(s), {records} records, {n} steps logged: CRCs and values check")


if __name__ == "__main__":
    main()
