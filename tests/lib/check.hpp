// Boost.Test helpers for Result<T>: fail with the error's sentence. The expression is
// evaluated once (it is often a call with side effects, such as a QP transition).
#pragma once

#include <boost/test/unit_test.hpp>
#include <string>

#define VRDMA_REQUIRE_OK(expr)                                                                     \
  do {                                                                                             \
    const auto& vrdma_check_r_ = (expr);                                                           \
    BOOST_REQUIRE_MESSAGE(vrdma_check_r_.ok(), (vrdma_check_r_.ok() ? std::string() : vrdma_check_r_.error().message)); \
  } while (0)
#define VRDMA_CHECK_OK(expr)                                                                       \
  do {                                                                                             \
    const auto& vrdma_check_r_ = (expr);                                                           \
    BOOST_CHECK_MESSAGE(vrdma_check_r_.ok(), (vrdma_check_r_.ok() ? std::string() : vrdma_check_r_.error().message)); \
  } while (0)
