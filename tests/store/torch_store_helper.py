"""PyTorch's side of torch_tcp_store_test: real torch.distributed.TCPStore
servers, and a real PyTorch client.

  torch_store_helper.py serve
      Reads commands on stdin, one a line, and answers each with one line:
        info                  -> "torch <version> libuv <0|1>": whether this
                                 torch has the libuv server at all
        new default|classic   -> "<port> <libuv 0|1>": starts a fresh server
                                 on a free port. "default" is what
                                 TCPStore(is_master=True) starts (libuv on
                                 2.x); "classic" asks for use_libuv=False (the
                                 same server where torch has only that one).
        drop <port>           -> "ok": stops that server
      Exits at the end of stdin, so that it never outlives the test. Prints
      "no-torch <reason>" and exits 3 when torch cannot be imported.

  torch_store_helper.py client <port>
      Plays a PyTorch client against a server that a ddp client also uses
      (see PythonClientSharesTheServer), printing "ok" at the end; any
      mismatch raises, and the exit status is not 0.
"""

import datetime
import sys

TIMEOUT = datetime.timedelta(seconds=120)


def import_torch():
    try:
        import torch
        import torch.distributed as dist
    except Exception as e:  # noqa: BLE001 - any failure means "no torch here"
        print(f"no-torch {type(e).__name__}: {e}", flush=True)
        sys.exit(3)
    return torch, dist


def has_libuv(dist):
    try:
        store = dist.TCPStore("127.0.0.1", 0, None, True, TIMEOUT,
                              wait_for_workers=False, use_libuv=True)
    except TypeError:  # torch 1.x: no use_libuv argument
        return False
    return bool(getattr(store, "libuvBackend", False))


def serve():
    torch, dist = import_torch()
    libuv_available = has_libuv(dist)
    servers = {}
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "info":
            print(f"torch {torch.__version__} libuv {int(libuv_available)}", flush=True)
        elif words[0] == "new":
            kwargs = {}
            if libuv_available:
                kwargs["use_libuv"] = words[1] == "default"
            store = dist.TCPStore("127.0.0.1", 0, None, True, TIMEOUT,
                                  wait_for_workers=False, **kwargs)
            port = store.port
            libuv = int(bool(getattr(store, "libuvBackend", False)))
            # The dict holds the only reference, so that drop stops it.
            servers[port] = store
            del store
            print(f"{port} {libuv}", flush=True)
        elif words[0] == "drop":
            del servers[int(words[1])]
            print("ok", flush=True)
        else:
            print(f"unknown command {words[0]!r}", flush=True)


def expect(what, got, want):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, expected {want!r}")


def client(port):
    _, dist = import_torch()
    store = dist.TCPStore("127.0.0.1", port, None, False, TIMEOUT)
    # What the ddp client wrote before starting us.
    store.wait(["from_ddp"])
    expect("get from_ddp", store.get("from_ddp"), b"hello from C++")
    expect("add shared_counter", store.add("shared_counter", 3), 5)
    expect("compare_set", store.compare_set("cas", "ddp", "python"), b"python")
    store.set("from_python", "hello from Python")
    # A wait here that only the ddp client's set ends.
    store.set("python_waiting", "1")
    store.wait(["ddp_late"])
    expect("get ddp_late", store.get("ddp_late"), b"late")
    expect("delete_key ddp_gone", store.delete_key("ddp_gone"), True)
    store.set("python_done", "1")
    print("ok", flush=True)


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "serve":
        serve()
    elif len(sys.argv) == 3 and sys.argv[1] == "client":
        client(int(sys.argv[2]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
