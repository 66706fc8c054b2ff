#include "comm/stream_comm.h"

#include <stdexcept>
#include <string>

#include "device/host_stream.h"

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

}  // namespace

std::unique_ptr<StreamComm> make_stream_comm(dev::Device& device, Communicator& parent) {
  if (device.backend() == dev::Backend::kHost) {
    return std::make_unique<HostStreamComm>(parent.duplicate());
  }
  (void)parent;
  throw std::runtime_error(
      "data parallelism on the CUDA backend needs the NCCL path, which is not built yet; "
      "run data-parallel jobs with --device host, or a single process on the GPU");
}

}  // namespace zo::comm
