#pragma once

// Checks that a call throws the expected exception type with a message that names what it should.

#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <vector>

namespace kvcache::test
{

//! Returns success when `call` throws `ExpectedError` whose message contains every string of `words`; the message is
//! stored in `*message` when given, so a test can check more of it.
template <typename ExpectedError, typename Call>
::testing::AssertionResult throwsNaming(
    Call&& call, std::vector<std::string> const& words = {}, std::string* message = nullptr)
{
    try
    {
        call();
    }
    catch (ExpectedError const& error)
    {
        std::string const text = error.what();
        if (message != nullptr)
        {
            *message = text;
        }
        for (std::string const& word : words)
        {
            if (text.find(word) == std::string::npos)
            {
                return ::testing::AssertionFailure()
                    << "the message \"" << text << "\" does not name \"" << word << "\"";
            }
        }
        return ::testing::AssertionSuccess();
    }
    catch (std::exception const& error)
    {
        return ::testing::AssertionFailure() << "threw an exception of another type: " << error.what();
    }
    return ::testing::AssertionFailure() << "did not throw";
}

} // namespace kvcache::test
