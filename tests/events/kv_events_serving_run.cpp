// A serving run that publishes its KV events, for the Python subscriber test (test_kv_events_subscriber.py): a
// PageManager of a full-attention and a windowed group serves requests from a few prompt families (some salted, some
// with an extra key) by continuous batching, publishing one batch a step. It prints its endpoints, waits for a
// subscriber, runs, prints the last sequence number, the hash seed and every hash each group has registered at the end
// (what the events must reconstruct), then keeps the replay socket open until a line or end of input arrives.
//
//   kv_events_serving_run <map|array> <steps> <random seed>

#include "paging/page_manager/page_manager_internal.h"

#include "kvcache/events/kv_event_publisher.h"
#include "kvcache/paging/page_manager.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "support/config_builder.h"

namespace
{

using namespace kvcache;
using namespace kvcache::rt;

std::string hex(PageHash hash)
{
    std::string text;
    char digits[3];
    for (uint64_t const word : {hash.lo, hash.hi})
    {
        for (int i = 0; i < 8; ++i)
        {
            std::snprintf(digits, sizeof(digits), "%02x", static_cast<unsigned>((word >> (8 * i)) & 0xff));
            text += digits;
        }
    }
    return text;
}

struct Request
{
    SequenceId sequence = -1;
    std::vector<int32_t> tokens;
    std::vector<PageExtraKey> keys;
    int32_t target = 0;
};

} // namespace

int main(int argc, char** argv)
{
    if (argc != 4)
    {
        std::fprintf(stderr, "usage: %s <map|array> <steps> <random seed>\n", argv[0]);
        return 2;
    }
    std::string const encoding = argv[1];
    int32_t const steps = std::stoi(argv[2]);
    std::mt19937 random(static_cast<uint32_t>(std::stoul(argv[3])));

    constexpr int32_t kP = 4;
    KVCacheConfig const config = test::ConfigBuilder({{1, 8}, {1, 8, 8}})
                                     .maxBatchSize(1)
                                     .maxSequenceLength(64)
                                     .tokensPerPage(kP)
                                     .maxTokensPerStep(16)
                                     .numPagesPerGroup({48, 24});
    PageManagerOptions options;
    options.maxSequences = 4;
    options.recordEvents = true;
    std::array<uint8_t, 32> seed{};
    for (size_t i = 0; i < seed.size(); ++i)
    {
        seed[i] = static_cast<uint8_t>(i * 7 + 1);
    }
    options.hashSeed = seed;
    PageManager manager(config, options);

    KVEventPublisherOptions publisherOptions;
    publisherOptions.endpoint = "tcp://127.0.0.1:*";
    publisherOptions.replayEndpoint = "tcp://127.0.0.1:*";
    publisherOptions.topic = "kv@test@model";
    publisherOptions.encoding = encoding == "array" ? KVEventEncoding::kTAGGED_ARRAY : KVEventEncoding::kTAGGED_MAP;
    publisherOptions.dataParallelRank = 0;
    KVEventPublisher publisher(publisherOptions);
    std::cout << "endpoints " << publisher.endpoint() << " " << publisher.replayEndpoint() << std::endl;
    if (!publisher.waitForSubscriber(20000))
    {
        std::fprintf(stderr, "no subscriber\n");
        return 3;
    }

    // Prompt families: requests share their prefixes; salts 0 (none), 1 and 2 keep tenants apart.
    std::vector<std::vector<int32_t>> families;
    for (int32_t f = 0; f < 4; ++f)
    {
        std::vector<int32_t> family(40);
        for (int32_t t = 0; t < 40; ++t)
        {
            family[static_cast<size_t>(t)] = 1000 * (f + 1) + t;
        }
        families.push_back(family);
    }
    std::vector<Request> running;
    KVEventBatch batch;
    int64_t last = -1;
    manager.takeEvents(batch);
    last = std::max(last, publisher.publish(batch));
    for (int32_t step = 0; step < steps; ++step)
    {
        while (running.size() < 3 && random() % 2 == 0)
        {
            Request request;
            uint8_t const salt[2] = {'t', static_cast<uint8_t>('0' + random() % 3)};
            bool const salted = salt[1] != '0';
            request.sequence = manager.create(SequenceOptions{salted ? salt : nullptr, salted ? size_t{2} : 0});
            std::vector<int32_t> const& family = families[random() % families.size()];
            int32_t const length = 6 + static_cast<int32_t>(random() % 30);
            request.tokens.assign(family.begin(), family.begin() + length);
            if (random() % 3 == 0)
            {
                request.keys.push_back(PageExtraKey{5, PageHash{0xabc0 + random() % 2, 0x77}});
            }
            request.target = length + static_cast<int32_t>(random() % 20);
            manager.adoptPrefix(request.sequence, request.tokens.data(), length, request.keys.data(),
                static_cast<int32_t>(request.keys.size()));
            running.push_back(request);
        }
        // Prefill in chunks of up to 8 tokens, then decode one token a step.
        std::vector<SequenceAppend> appends;
        for (Request& request : running)
        {
            int32_t const length = manager.length(request.sequence);
            auto const prompt = static_cast<int32_t>(request.tokens.size());
            int32_t count = length < prompt ? std::min(8, prompt - length) : 1;
            if (length >= prompt)
            {
                request.tokens.push_back(static_cast<int32_t>(random() % 50));
            }
            std::vector<PageExtraKey> const* keys = &request.keys;
            int32_t numKeys = 0;
            for (PageExtraKey const& key : *keys)
            {
                numKeys += key.position >= length && key.position < length + count ? 1 : 0;
            }
            PageExtraKey const* first = keys->data();
            while (numKeys > 0 && first->position < length)
            {
                ++first;
            }
            appends.push_back(SequenceAppend{
                request.sequence, request.tokens.data() + length, count, numKeys > 0 ? first : nullptr, numKeys});
        }
        if (!appends.empty() && manager.canStep(appends.data(), static_cast<int32_t>(appends.size())))
        {
            manager.step(appends.data(), static_cast<int32_t>(appends.size()));
        }
        else if (!running.empty())
        {
            // Out of pages: the oldest request is preempted (freed).
            manager.free(running.front().sequence);
            running.erase(running.begin());
        }
        for (size_t i = 0; i < running.size();)
        {
            if (manager.length(running[i].sequence) >= running[i].target || random() % 20 == 0)
            {
                manager.free(running[i].sequence);
                running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
            }
            else
            {
                ++i;
            }
        }
        if (random() % 25 == 0)
        {
            manager.evictCached(static_cast<int32_t>(random() % 2), 3);
        }
        manager.takeEvents(batch);
        last = std::max(last, publisher.publish(batch));
    }
    if (!publisher.flush(20000))
    {
        std::fprintf(stderr, "the batches were not sent within 20 s\n");
        return 4;
    }
    KVEventPublisherStats const stats = publisher.stats();
    std::cout << "last " << last << "\n";
    std::cout << "dropped " << stats.droppedBatches << "\n";
    std::string seedHex;
    for (uint8_t const byte : seed)
    {
        char digits[3];
        std::snprintf(digits, sizeof(digits), "%02x", static_cast<unsigned>(byte));
        seedHex += digits;
    }
    std::cout << "seed " << seedHex << "\n";
    std::vector<PageHash> hashes;
    for (int32_t g = 0; g < manager.numGroups(); ++g)
    {
        detail::PageManagerInternal::registeredHashes(manager, g, hashes);
        for (PageHash const hash : hashes)
        {
            std::cout << "registered " << g << " " << hex(hash) << "\n";
        }
    }
    std::cout << "end" << std::endl;
    std::string line;
    std::getline(std::cin, line);
    return 0;
}
