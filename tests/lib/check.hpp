// Boost.Test helpers for Result<T>: fail with the error's sentence.
#pragma once

#include <boost/test/unit_test.hpp>
#include <string>

#define VRDMA_REQUIRE_OK(r) BOOST_REQUIRE_MESSAGE((r).ok(), ((r).ok() ? std::string() : (r).error().message))
#define VRDMA_CHECK_OK(r) BOOST_CHECK_MESSAGE((r).ok(), ((r).ok() ? std::string() : (r).error().message))
