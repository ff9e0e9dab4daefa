//! [`unary_exec_boilerplate`]: the parts of `ExecutionPlan` that are the same
//! for every single-input udfchain operator (the UDF operators and
//! `PrefetchExec`): name, properties, one child, no expressions, rebuilt over a
//! new child, metrics. Imports nothing from `plan/`, so every operator can use it.

/// Implements the parts of `ExecutionPlan` that are the same for every
/// single-input udfchain operator. The type needs fields `input`,
/// `properties`, `metrics` and a method `with_input(&self, input) -> Self`.
macro_rules! unary_exec_boilerplate {
    ($name:expr $(, $base:ident)?) => {
        fn name(&self) -> &str {
            $name
        }

        fn properties(&self) -> &std::sync::Arc<datafusion::physical_plan::PlanProperties> {
            &self$(.$base)?.properties
        }

        fn children(&self) -> Vec<&std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
            vec![&self$(.$base)?.input]
        }

        fn benefits_from_input_partitioning(&self) -> Vec<bool> {
            // Each operator runs `parallel` calls itself; more partitions would
            // only scatter the input order.
            vec![false]
        }

        fn apply_expressions(
            &self,
            _f: &mut dyn FnMut(
                &std::sync::Arc<dyn datafusion::physical_expr::PhysicalExpr>,
            ) -> datafusion::error::Result<
                datafusion::common::tree_node::TreeNodeRecursion,
            >,
        ) -> datafusion::error::Result<datafusion::common::tree_node::TreeNodeRecursion> {
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        }

        fn with_new_children(
            self: std::sync::Arc<Self>,
            mut children: Vec<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>,
        ) -> datafusion::error::Result<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>
        {
            if children.len() != 1 {
                return datafusion::common::internal_err!("{} takes one input", $name);
            }
            Ok(std::sync::Arc::new(
                self.with_input(children.swap_remove(0)),
            ))
        }

        fn metrics(&self) -> Option<datafusion::physical_plan::metrics::MetricsSet> {
            Some(self$(.$base)?.metrics.clone_inner())
        }
    };
}

pub(crate) use unary_exec_boilerplate;
