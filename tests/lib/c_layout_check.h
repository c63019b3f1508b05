/*
 * Layout checks for the plain-C headers (the device contract, the guest driver's ABI), for C11
 * test programs built with -pedantic-errors: each check compares a size, offset or value with
 * the literal number the documents give, prints the ones that differ, and counts them in
 * `layout_failures` (the program's exit status).
 */
#ifndef VRDMA_TESTS_C_LAYOUT_CHECK_H
#define VRDMA_TESTS_C_LAYOUT_CHECK_H

#include <stddef.h>
#include <stdio.h>

static int layout_failures;

static void check(const char *what, unsigned long long got, unsigned long long want)
{
	if (got != want) {
		fprintf(stderr, "FAIL %s: %llu, expected %llu\n", what, got, want);
		++layout_failures;
	}
}

#define SIZE(type, n) check("sizeof(struct " #type ")", sizeof(struct type), (n))
/* A field at byte `off`, `len` bytes wide. */
#define FIELD(type, field, off, len)                                                  \
	do {                                                                          \
		check("offsetof(" #type ", " #field ")", offsetof(struct type, field), (off)); \
		check("sizeof(" #type "." #field ")", sizeof(((struct type *)0)->field), (len)); \
	} while (0)
#define VALUE(name, n) check(#name, (name), (n))

#endif
