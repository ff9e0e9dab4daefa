//! Under pressure: a full disk, files larger than memory, millions of
//! objects. Memory bounds are measured in a child process of their own
//! (`udfchain_testkit::run_child_test`), never in the test's process, which
//! shares its heap with the tests running beside it.

mod full_disk;
mod large_files;
mod many_objects;
