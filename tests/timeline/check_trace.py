#!/usr/bin/env python3
"""Checks what `ddprun --trace DIR` wrote for a DDP job (tests/timeline).

  check_trace.py DIR RANK0_LOG WORLD_SIZE

DIR/trace.json must follow the Chrome Trace Event Format's rules (the JSON
object form: "traceEvents", each event's required fields and types per
phase, "M" metadata naming every process and thread used, complete events
of one thread properly nested), hold every rank as a process, and show the
same overlap of the bucket allreduces with backward that DDP's insight
printed for that iteration (DDP_DEBUG=1 on rank 0, in RANK0_LOG): the
communication time and the overlapped share within 10%. DIR/trace.svg must
parse as XML and hold one row per rank and track of the merged trace.
Prints what it checked; exits 1 naming the first rule broken.
"""
import json
import re
import sys
import xml.etree.ElementTree as ET

PHASES_WITH_DURATION = {"X"}
KNOWN_PHASES = {"X", "B", "E", "i", "I", "M", "C", "b", "e", "n", "s", "t", "f", "P", "O", "N", "D"}
METADATA_NAMES = {"process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"}


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_format(trace):
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        fail("the top level is not an object with a traceEvents array")
    if trace.get("displayTimeUnit") not in (None, "ms", "ns"):
        fail("displayTimeUnit must be ms or ns, got %r" % trace.get("displayTimeUnit"))
    named_processes, named_threads, used = set(), set(), set()
    for n, event in enumerate(trace["traceEvents"]):
        where = "event %d (%s)" % (n, json.dumps(event)[:120])
        if not isinstance(event, dict):
            fail(where + ": not an object")
        ph = event.get("ph")
        if ph not in KNOWN_PHASES:
            fail(where + ": unknown phase %r" % ph)
        if not isinstance(event.get("name"), str):
            fail(where + ": no name string")
        if not isinstance(event.get("pid"), int) or not isinstance(event.get("tid"), int):
            fail(where + ": pid and tid must be integers")
        if "args" in event and not isinstance(event["args"], dict):
            fail(where + ": args must be an object")
        if ph == "M":
            if event["name"] not in METADATA_NAMES:
                fail(where + ": unknown metadata name")
            args = event.get("args", {})
            if event["name"].endswith("_name") and not isinstance(args.get("name"), str):
                fail(where + ": a *_name metadata event needs args.name")
            if event["name"].endswith("_sort_index") and not isinstance(args.get("sort_index"), int):
                fail(where + ": a *_sort_index metadata event needs an integer args.sort_index")
            if event["name"] == "process_name":
                named_processes.add(event["pid"])
            if event["name"] == "thread_name":
                named_threads.add((event["pid"], event["tid"]))
            continue
        if not is_number(event.get("ts")):
            fail(where + ": ts must be a number (microseconds)")
        if ph in PHASES_WITH_DURATION and (not is_number(event.get("dur")) or event["dur"] < 0):
            fail(where + ": a complete event needs dur >= 0 (microseconds)")
        if ph in ("i", "I") and event.get("s", "t") not in ("g", "p", "t"):
            fail(where + ": an instant event's scope s must be g, p or t")
        used.add((event["pid"], event["tid"]))
    for pid, tid in sorted(used):
        if pid not in named_processes:
            fail("process %d has events but no process_name" % pid)
        if (pid, tid) not in named_threads:
            fail("thread %d of process %d has events but no thread_name" % (tid, pid))
    # Complete events of one thread must nest: sorted by start, each one
    # either starts after the enclosing one ends or ends within it.
    by_thread = {}
    for event in trace["traceEvents"]:
        if event["ph"] == "X":
            by_thread.setdefault((event["pid"], event["tid"]), []).append(event)
    for key, events in by_thread.items():
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for event in events:
            while stack and stack[-1] <= event["ts"]:
                stack.pop()
            end = event["ts"] + event["dur"]
            if stack and end > stack[-1]:
                fail("thread %d of process %d: %r overlaps the event around it without nesting"
                     % (key[1], key[0], event["name"]))
            stack.append(end)
    return named_threads


def insight_of(log_path):
    """The last DDP insight rank 0 printed: iteration, comm ms, overlap %."""
    pattern = re.compile(r"DDP iteration (\d+): forward [0-9.]+ ms, backward ([0-9.]+) ms, "
                         r"communication ([0-9.]+) ms \((\d+)% overlapped")
    found = None
    with open(log_path, errors="replace") as log:
        for line in log:
            match = pattern.search(line)
            if match:
                found = (int(match.group(1)), float(match.group(2)), float(match.group(3)), int(match.group(4)))
    if found is None:
        fail("no 'DDP iteration N: ...' insight line in " + log_path + " (DDP_DEBUG=1 on rank 0)")
    return found


def overlap_in_trace(trace, iteration):
    """Rank 0's comm ms and overlapped share of `iteration`, from its events."""
    backward = [e for e in trace["traceEvents"] if e["pid"] == 0 and e["ph"] == "X" and e["name"] == "backward"
                and e.get("args", {}).get("iteration") == iteration]
    buckets = [e for e in trace["traceEvents"] if e["pid"] == 0 and e["ph"] == "X"
               and e["name"].startswith("bucket ") and e.get("args", {}).get("iteration") == iteration]
    if len(backward) != 1 or not buckets:
        fail("rank 0's trace has %d backward event(s) and %d bucket(s) for iteration %d; expected 1 and some"
             % (len(backward), len(buckets), iteration))
    start, end = backward[0]["ts"], backward[0]["ts"] + backward[0]["dur"]
    comm = sum(b["dur"] for b in buckets)
    overlapped = sum(max(0, min(b["ts"] + b["dur"], end) - b["ts"]) for b in buckets)
    return comm / 1000.0, (overlapped / comm if comm > 0 else 0.0), (end - start) / 1000.0, len(buckets)


def within(a, b, relative, absolute):
    return abs(a - b) <= max(relative * max(abs(a), abs(b)), absolute)


def main():
    if len(sys.argv) != 4:
        fail("usage: check_trace.py DIR RANK0_LOG WORLD_SIZE")
    directory, log_path, world_size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(directory + "/trace.json") as f:
        trace = json.load(f)
    threads = check_format(trace)
    pids = sorted({pid for pid, _ in threads})
    if pids != list(range(world_size)):
        fail("the merged trace has processes %s, expected ranks 0-%d" % (pids, world_size - 1))
    names = {tid_name for tid_name in (e["args"]["name"] for e in trace["traceEvents"]
                                       if e["ph"] == "M" and e["name"] == "thread_name")}
    # "waits" is there only when some wait blocked, which a fast allreduce may not.
    for track in ("DDP step", "buckets", "optimizer"):
        if track not in names:
            fail("no %r track in the merged trace (tracks: %s)" % (track, sorted(names)))
    if not any(name.startswith("collectives: default (") for name in names):
        fail("no track of the default group's collectives (tracks: %s)" % sorted(names))
    print("check_trace: trace.json follows the Trace Event Format: %d events, %d ranks, %d tracks"
          % (len(trace["traceEvents"]), len(pids), len(threads)))

    iteration, backward_ms, comm_ms, overlap_percent = insight_of(log_path)
    trace_comm, trace_overlap, trace_backward, buckets = overlap_in_trace(trace, iteration)
    print("check_trace: iteration %d, insight: backward %.2f ms, communication %.2f ms, %d%% overlapped; "
          "trace: backward %.2f ms, communication %.2f ms in %d bucket(s), %.0f%% overlapped"
          % (iteration, backward_ms, comm_ms, overlap_percent, trace_backward, trace_comm, buckets,
             trace_overlap * 100))
    # The insight prints 2 decimals of ms and a whole percent; the trace has microseconds.
    if not within(trace_comm, comm_ms, 0.10, 0.02):
        fail("communication: trace %.3f ms, insight %.2f ms (more than 10%% apart)" % (trace_comm, comm_ms))
    if not within(trace_overlap * 100, overlap_percent, 0.10, 1.0):
        fail("overlap: trace %.1f%%, insight %d%% (more than 10%% apart)" % (trace_overlap * 100, overlap_percent))
    if not within(trace_backward, backward_ms, 0.10, 0.02):
        fail("backward: trace %.3f ms, insight %.2f ms (more than 10%% apart)" % (trace_backward, backward_ms))

    svg = ET.parse(directory + "/trace.svg").getroot()
    if svg.tag != "{http://www.w3.org/2000/svg}svg":
        fail("trace.svg's root is %s, not an SVG element" % svg.tag)
    rows = [(int(g.get("data-rank")), g.get("data-track")) for g in svg.iter("{http://www.w3.org/2000/svg}g")
            if g.get("class") == "row"]
    thread_names = {(e["pid"], e["args"]["name"]) for e in trace["traceEvents"]
                    if e["ph"] == "M" and e["name"] == "thread_name"}
    if sorted(rows) != sorted(thread_names) or len(rows) != len(set(rows)):
        fail("trace.svg's rows %s are not one per rank and track %s" % (sorted(rows), sorted(thread_names)))
    bars = sum(1 for r in svg.iter("{http://www.w3.org/2000/svg}rect") if r.find("{http://www.w3.org/2000/svg}title") is not None)
    if bars == 0:
        fail("trace.svg draws no span")
    print("check_trace: trace.svg parses, %d rows (one per rank and track), %d spans drawn" % (len(rows), bars))
    print("check_trace: OK")


main()
