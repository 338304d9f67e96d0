#pragma once

// A host tier's transfers in flight: the event recorded after each host-list transfer, remembered for every host page
// and device page it touched and for the staging half it used, so later transfers on other streams wait for it and
// host readers can wait on it.

#include "core/cuda_owners.h"

#include "kvcache/tiers/host_tier.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace kvcache::rt::detail
{

//! In-flight tracking of one host tier's host-list transfers. Not thread-safe.
class TransferTracker
{
public:
    //! No staging half: the transfer did not use the copy-engine path.
    static constexpr int32_t kNO_STAGING = -1;

    //! Tracks `numHostPages` host pages and `numDevicePages` device page ids.
    TransferTracker(int64_t numHostPages, int32_t numDevicePages);
    //! Waits on the host for every transfer recorded, then destroys the events; never throws.
    ~TransferTracker() noexcept;
    TransferTracker(TransferTracker const&) = delete;
    TransferTracker& operator=(TransferTracker const&) = delete;

    //! Makes `stream` wait (cudaStreamWaitEvent) for the recorded transfers on other streams, not yet complete, that
    //! touched an entry's host page or page, or staging half `stagingHalf` (kNO_STAGING: none). Throws CudaError.
    void waitForOverlaps(HostTierEntry const* entries, int32_t count, int32_t stagingHalf, cudaStream_t stream);
    //! Records an event on `stream` after a transfer of `entries` (that used staging half `stagingHalf`) and remembers
    //! it for each entry. Throws CudaError.
    void record(HostTierEntry const* entries, int32_t count, int32_t stagingHalf, cudaStream_t stream);
    //! Returns true while a recorded transfer touching `hostPage` (checked by the caller) has not completed.
    bool isBusy(int32_t hostPage) const;
    //! Waits on the host for the recorded transfers touching `hostPages[0, count)` (checked by the caller). Throws
    //! CudaError when a transfer failed.
    void synchronize(int32_t const* hostPages, int64_t count);
    //! Returns the event recorded after the latest transfer (nullptr before the first).
    cudaEvent_t lastEvent() const noexcept;

private:
    //! A transfer's completion: the event recorded after it and the stream it ran on.
    struct Record
    {
        CudaEvent event;
        cudaStream_t stream = nullptr;
    };
    using RecordPtr = std::shared_ptr<Record>;

    RecordPtr acquireRecord();

    std::vector<RecordPtr> mRecords{}; //!< every record made; one held by nobody else is free to record again
    size_t mNextRecord = 0;
    std::vector<RecordPtr> mHostPageLast{}; //!< per host page: its latest transfer (null: none in flight, as known)
    std::vector<RecordPtr> mPageLast{};     //!< per device page id of the group
    RecordPtr mLast{};
    RecordPtr mStagingLast[2]{}; //!< per staging half: the latest copy-engine transfer that used it
};

} // namespace kvcache::rt::detail
