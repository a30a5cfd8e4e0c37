#pragma once

// The one door to Gloo's headers (private header). Every ddp source that
// uses Gloo includes this file and no <gloo/...> header directly.
//
// With a private Gloo (DDP_PRIVATE_GLOO, see cmake/gloo.cmake) the Gloo code
// inside libddp.so is compiled with hidden visibility, and so must be every
// Gloo declaration that ddp's own sources see: otherwise the inline functions,
// templates, vtables and typeinfo of Gloo's classes that our translation
// units emit would be exported, and would be merged at load time with the
// same-named symbols of another Gloo in the process (the one inside a PyPI
// LibTorch), each built for other class layouts. The system headers that Gloo
// uses are included first, outside the hidden region, so that only Gloo's own
// declarations become hidden.

#include <netinet/in.h>
#include <stddef.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <iomanip>
#include <iostream>
#include <limits>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#if defined(DDP_PRIVATE_GLOO)
#pragma GCC visibility push(hidden)
#endif

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/scatter.h>
#include <gloo/transport/device.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#if defined(DDP_PRIVATE_GLOO)
#pragma GCC visibility pop
#endif

// Marks ddp's own classes that derive from a Gloo class: they must be no more
// visible than their base.
#if defined(DDP_PRIVATE_GLOO)
#define DDP_GLOO_HIDDEN __attribute__((visibility("hidden")))
#else
#define DDP_GLOO_HIDDEN
#endif
