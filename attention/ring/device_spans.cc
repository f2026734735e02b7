#include "attention/ring/device_spans.h"

namespace ra {

int DeviceSpans::begin(std::string name, cudaStream_t stream) {
  const size_t span = names_.size();
  names_.push_back(std::move(name));
  while (events_.size() < 2 * names_.size()) events_.push_back(std::make_unique<CudaEvent>(true));
  events_[2 * span]->record(stream);
  return int(span);
}

void DeviceSpans::end(int span, cudaStream_t stream) const { events_[2 * size_t(span) + 1]->record(stream); }

std::vector<DeviceSpan> DeviceSpans::read() const {
  std::vector<DeviceSpan> spans;
  for (size_t i = 0; i < names_.size(); ++i) {
    RA_CUDA_CHECK(cudaEventSynchronize(events_[2 * i + 1]->get()));
    spans.push_back({names_[i], events_[2 * i]->milliseconds_since(*events_[0]),
                     events_[2 * i + 1]->milliseconds_since(*events_[0])});
  }
  return spans;
}

}  // namespace ra
