//! Every row once when Ballista reruns a stage (an executor lost mid-query).
//!
//! Ballista 55's scheduler keeps a stage's output locations as a list that
//! reruns append to: when an executor is lost, a stage that read from it is
//! rolled back and runs again, but the outputs its tasks on *live* executors
//! already reported stay listed (only the lost executor's are removed). The
//! rerun then lists the same map output twice, and its readers read it twice:
//! with a kill -9 mid-query the client got 61-65 rows of 40 in about one run
//! of eight (`cluster::an_executor_killed_mid_query_…`, under load).
//!
//! Two fixes, each for one place the duplicates reach:
//!
//! - [`one_read_per_map_output`]: an executor decoding a shuffle read keeps
//!   one location per (stage, output partition, map partition) — the last
//!   listed, the newest attempt. A map task's output is the same whichever
//!   attempt wrote it (the spread's hash partitioning is deterministic), so
//!   any copy will do.
//! - [`OneFinalTask`]: the job's final stage is one task (the output is
//!   merged on the cluster before it reaches the client). The scheduler adds
//!   a final stage's outputs to the job's result as its tasks finish and
//!   rollbacks never remove them, so a final stage of several tasks rolled
//!   back after one finished would hand that output to the client twice; a
//!   final stage of one task finishes the job as it finishes.
//!
//! Not covered: a `workers` spread of rows that read no file uses round
//! robin, which a rerun may deal differently.

use std::sync::Arc;

use ballista_core::serde::protobuf::BallistaPhysicalPlanNode;
use ballista_core::serde::protobuf::ballista_physical_plan_node::PhysicalPlanType;
use datafusion::common::config::ConfigOptions;
use datafusion::error::Result as DfResult;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use prost::Message;

/// `buf` (a Ballista plan node) with one location per map output in its
/// shuffle reads, or `None` when there is nothing to change (not a shuffle
/// read, no repeated location, or not decodable: Ballista's codec then says
/// what is wrong).
pub fn one_read_per_map_output(buf: &[u8]) -> Option<Vec<u8>> {
    let mut node = BallistaPhysicalPlanNode::decode(buf).ok()?;
    let partitions = match node.physical_plan_type.as_mut()? {
        PhysicalPlanType::ShuffleReader(r) => &mut r.partition,
        PhysicalPlanType::RangeShuffleReader(r) => &mut r.partition,
        _ => return None,
    };
    let mut changed = false;
    for partition in partitions {
        let key = |l: &ballista_core::serde::protobuf::PartitionLocation| {
            let id = l.partition_id.as_ref();
            (
                id.map(|p| p.stage_id),
                id.map(|p| p.partition_id),
                l.map_partition_id,
            )
        };
        let before = partition.location.len();
        // Keep the last of each key (the newest attempt), in listed order.
        let mut seen = std::collections::HashSet::new();
        let mut kept: Vec<_> = partition
            .location
            .drain(..)
            .rev()
            .filter(|l| seen.insert(key(l)))
            .collect();
        kept.reverse();
        changed |= kept.len() != before;
        partition.location = kept;
    }
    changed.then(|| node.encode_to_vec())
}

/// The physical optimizer rule that makes a cluster job's final stage one
/// task (see the module header): a plan giving several partitions gets them
/// merged at its root.
#[derive(Debug, Default)]
pub struct OneFinalTask;

impl PhysicalOptimizerRule for OneFinalTask {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(if plan.output_partitioning().partition_count() > 1 {
            Arc::new(CoalescePartitionsExec::new(plan))
        } else {
            plan
        })
    }

    fn name(&self) -> &str {
        "udfchain_one_final_task"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ballista_core::serde::protobuf::{
        PartitionId, PartitionLocation, ShuffleReaderExecNode, ShuffleReaderPartition,
    };

    fn loc(partition: u32, map: u32, executor: &str) -> PartitionLocation {
        PartitionLocation {
            map_partition_id: map,
            partition_id: Some(PartitionId {
                job_id: "j".into(),
                stage_id: 1,
                partition_id: partition,
            }),
            executor_meta: Some(ballista_core::serde::protobuf::ExecutorMetadata {
                id: executor.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn reader(partitions: Vec<Vec<PartitionLocation>>) -> Vec<u8> {
        BallistaPhysicalPlanNode {
            physical_plan_type: Some(PhysicalPlanType::ShuffleReader(ShuffleReaderExecNode {
                partition: partitions
                    .into_iter()
                    .map(|location| ShuffleReaderPartition { location })
                    .collect(),
                stage_id: 2,
                ..Default::default()
            })),
        }
        .encode_to_vec()
    }

    fn locations(buf: &[u8]) -> Vec<Vec<(u32, u32, String)>> {
        match BallistaPhysicalPlanNode::decode(buf)
            .expect("decodes")
            .physical_plan_type
        {
            Some(PhysicalPlanType::ShuffleReader(r)) => r
                .partition
                .into_iter()
                .map(|p| {
                    p.location
                        .into_iter()
                        .map(|l| {
                            let id = l.partition_id.expect("id");
                            let exec = l.executor_meta.expect("meta").id;
                            (id.partition_id, l.map_partition_id, exec)
                        })
                        .collect()
                })
                .collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_map_output_listed_twice_is_read_once_from_its_newest_attempt() {
        // Output partition 0 read from map tasks 0 and 1; map 1 ran again on
        // "b" after a rollback, so it is listed twice.
        let buf = reader(vec![
            vec![loc(0, 0, "a"), loc(0, 1, "b"), loc(0, 1, "b2")],
            vec![loc(1, 0, "a"), loc(1, 1, "b"), loc(1, 1, "b2")],
        ]);
        let fixed = one_read_per_map_output(&buf).expect("changed");
        assert_eq!(
            locations(&fixed),
            vec![
                vec![(0, 0, "a".into()), (0, 1, "b2".into())],
                vec![(1, 0, "a".into()), (1, 1, "b2".into())],
            ]
        );
    }

    #[test]
    fn distinct_map_outputs_and_other_nodes_are_left_alone() {
        let buf = reader(vec![vec![loc(0, 0, "a"), loc(0, 1, "a"), loc(0, 2, "b")]]);
        assert_eq!(one_read_per_map_output(&buf), None);
        let other = BallistaPhysicalPlanNode {
            physical_plan_type: None,
        }
        .encode_to_vec();
        assert_eq!(one_read_per_map_output(&other), None);
        assert_eq!(one_read_per_map_output(b"udfchain/1:xyz"), None);
    }
}
