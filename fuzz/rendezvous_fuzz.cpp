// Fuzzes the TCP rendezvous's messages (comm/tcp_rendezvous.h, detail::): a rank's hello as rank 0
// reads and checks it, and rank 0's answer header as a rank reads it; the sockets around them are
// exercised by tests/comm/tcp_rendezvous_test.cpp. The first byte sets rank 0's world (1 to 8 ranks),
// the second which ranks are already in; then 24-byte hellos and 8-byte answer headers alternate. Rank
// 0's job id is "fuzz".
#include <algorithm>
#include <optional>
#include <span>
#include <vector>

#include "colossal/comm/tcp_rendezvous.h"  // detail::decode_hello, check_hello, decode_answer_header
#include "fuzz_support.h"                  // accept_errors, property_failed

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace colossal;
  using namespace colossal::comm::detail;
  if (size < 2) return 0;
  comm::RendezvousOptions options;
  options.job_id = "fuzz";
  options.world_size = 1 + data[0] % 8;
  std::vector<bool> arrived(static_cast<size_t>(options.world_size));
  for (int r = 1; r < options.world_size; ++r) arrived[static_cast<size_t>(r)] = (data[1] >> r) & 1;
  size_t pos = 2;
  while (pos + kHelloBytes <= size) {
    const std::span<const uint8_t, kHelloBytes> hello_bytes(data + pos, kHelloBytes);
    pos += kHelloBytes;
    const std::optional<RendezvousHello> hello = decode_hello(hello_bytes);
    // As rank 0 does: a hello of another job is refused without a check, one of ours is checked.
    if (hello && hello->job == job_hash(options.job_id)) {
      fuzz::accept_errors([&] {
        check_hello(*hello, options, arrived);
        if (hello->rank < 1 || hello->rank >= options.world_size || arrived[static_cast<size_t>(hello->rank)]) {
          fuzz::property_failed("check_hello took a rank outside the world or one already in");
        }
        const std::vector<uint8_t> again = encode_hello(hello->rank, hello->world_size, options.job_id);
        if (!std::equal(again.begin(), again.end(), hello_bytes.begin())) fuzz::property_failed("hello round trip");
        arrived[static_cast<size_t>(hello->rank)] = true;
      });
    }
    if (pos + kAnswerHeaderBytes > size) break;
    const std::span<const uint8_t, kAnswerHeaderBytes> answer(data + pos, kAnswerHeaderBytes);
    pos += kAnswerHeaderBytes;
    fuzz::accept_errors([&] {
      const uint32_t length = decode_answer_header(answer, options);
      if (length > kMaxRendezvousBlob && length != kRefusal) fuzz::property_failed("a blob over the limit");
    });
  }
  return 0;
}
