#include "comm/mpi/mpi_ring.h"

#include <algorithm>

#include "comm/mpi/mpi_runtime.h"

namespace ddp::internal::mpi {

namespace {

constexpr int kReduceScatterTag = 1;
constexpr int kAllgatherTag = 2;

// Segment `index` of a buffer of `count` elements cut into `size` segments.
struct Segment {
  int begin;
  int length;
};

Segment segment(int count, int size, int index) {
  const int64_t per = (static_cast<int64_t>(count) + size - 1) / size;
  const int64_t begin = std::min<int64_t>(count, per * index);
  const int64_t end = std::min<int64_t>(count, per * (index + 1));
  return {static_cast<int>(begin), static_cast<int>(end - begin)};
}

// Sends `send` elements at `send_data` to `next` and receives `receive`
// elements into `receive_data` from `previous`, both at once.
void exchange(const void* send_data, int send, void* receive_data, int receive,
              MPI_Datatype datatype, int next, int previous, int tag, MPI_Comm comm) {
  MPI_Request requests[2];
  check_mpi(MPI_Irecv(receive_data, receive, datatype, previous, tag, comm, &requests[0]),
            "ring allreduce: MPI_Irecv");
  check_mpi(MPI_Isend(send_data, send, datatype, next, tag, comm, &requests[1]),
            "ring allreduce: MPI_Isend");
  check_mpi(MPI_Waitall(2, requests, MPI_STATUSES_IGNORE), "ring allreduce: MPI_Waitall");
}

} // namespace

void ring_allreduce(void* data, int count, size_t element_size, MPI_Datatype datatype,
                    const ReduceKernel& kernel, MPI_Comm comm, int rank, int size,
                    std::vector<uint8_t>& scratch) {
  if (size == 1 || count == 0) {
    return;
  }
  auto* bytes = static_cast<uint8_t*>(data);
  const auto at = [&](const Segment& s) { return bytes + static_cast<size_t>(s.begin) * element_size; };
  const int next = (rank + 1) % size;
  const int previous = (rank + size - 1) % size;
  scratch.resize(static_cast<size_t>(segment(count, size, 0).length) * element_size);

  for (int step = 0; step < size - 1; ++step) {
    const Segment send = segment(count, size, (rank - step + size) % size);
    const Segment receive = segment(count, size, (rank - step - 1 + 2 * size) % size);
    exchange(at(send), send.length, scratch.data(), receive.length, datatype, next, previous,
             kReduceScatterTag, comm);
    kernel(at(receive), at(receive), scratch.data(), static_cast<size_t>(receive.length));
  }
  for (int step = 0; step < size - 1; ++step) {
    const Segment send = segment(count, size, (rank + 1 - step + size) % size);
    const Segment receive = segment(count, size, (rank - step + size) % size);
    exchange(at(send), send.length, at(receive), receive.length, datatype, next, previous,
             kAllgatherTag, comm);
  }
}

} // namespace ddp::internal::mpi
