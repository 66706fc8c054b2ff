#include "comm/stream_comm.h"

#include <stdexcept>
#include <string>

#include "device/host_stream.h"
#ifdef ZO_HAVE_CUDA
#include "gpu/nccl_comm.h"
#endif

namespace zo::comm {
namespace {

// The host backend: a collective is a task on the stream's worker thread, so it runs after the
// work enqueued before it and before the work enqueued after it, as on a CUDA stream.
class HostStreamComm final : public StreamComm {
 public:
  explicit HostStreamComm(std::unique_ptr<Communicator> comm) : comm_(std::move(comm)) {}
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }

  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype,
                      dev::Stream& s) override {
    check_f32(dtype, "reduce_scatter");
    host(s).enqueue([c = comm_.get(), in, out, count] {
      c->reduce_scatter(static_cast<const float*>(in), static_cast<float*>(out), count);
    });
  }

  // MPI collectives end by themselves: each is bounded by the communicator's timeout.
  void abort() noexcept override {}

  void all_gather(const void* in, void* out, std::size_t count, DType dtype,
                  dev::Stream& s) override {
    host(s).enqueue([c = comm_.get(), in, out, bytes = count * dtype_size(dtype)] {
      c->all_gather(in, out, bytes);
    });
  }

 private:
  static void check_f32(DType d, const char* what) {
    if (d != DType::kF32) {
      throw std::invalid_argument(std::string("host ") + what + ": the host backend is fp32 only");
    }
  }
  static dev::HostStream& host(dev::Stream& s) {
    auto* h = dynamic_cast<dev::HostStream*>(&s);
    if (h == nullptr) throw std::logic_error("host stream collective on a non-host stream");
    return *h;
  }

  std::unique_ptr<Communicator> comm_;
};

#ifdef ZO_HAVE_CUDA
// The CUDA backend: NCCL on the stream's cudaStream_t, which the CUDA device's streams expose as
// their native handle.
class NcclStreamComm final : public StreamComm {
 public:
  NcclStreamComm(const gpu::NcclId& id, int rank, int size, int device, double timeout_s)
      : nccl_(id, rank, size, device, timeout_s) {}
  int rank() const override { return nccl_.rank(); }
  int size() const override { return nccl_.size(); }
  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype,
                      dev::Stream& s) override {
    nccl_.reduce_scatter(in, out, count, dtype, native(s));
  }
  void all_gather(const void* in, void* out, std::size_t count, DType dtype,
                  dev::Stream& s) override {
    nccl_.all_gather(in, out, count, dtype, native(s));
  }
  void abort() noexcept override { nccl_.abort(); }

 private:
  static void* native(dev::Stream& s) {
    void* handle = s.native_handle();
    if (handle == nullptr)
      throw std::logic_error("NCCL collective on a stream without a CUDA stream");
    return handle;
  }

  gpu::NcclComm nccl_;
};
#endif

}  // namespace

std::unique_ptr<StreamComm> make_stream_comm(dev::Device& device, Communicator& parent,
                                             double timeout_s) {
  if (device.backend() == dev::Backend::kHost) {
    return std::make_unique<HostStreamComm>(parent.duplicate());
  }
#ifdef ZO_HAVE_CUDA
  // NCCL, bootstrapped through the parent: rank 0's unique id broadcast to every rank.
  gpu::NcclId id{};
  if (parent.rank() == 0) id = gpu::NcclComm::unique_id();
  parent.broadcast(id.data(), id.size(), 0);
  return std::make_unique<NcclStreamComm>(id, parent.rank(), parent.size(), device.cuda_ordinal(),
                                          timeout_s);
#else
  (void)parent;
  (void)timeout_s;
  throw std::logic_error("stream collectives: a CUDA device in a build without CUDA");
#endif
}

}  // namespace zo::comm
