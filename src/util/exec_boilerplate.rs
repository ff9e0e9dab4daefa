//! [`exec_boilerplate`]: the parts of DataFusion's `ExecutionPlan` that are
//! the same for every udfchain operator: its name, its properties (a
//! `properties` field), its children (none, or one `input`), no expressions,
//! rebuilt over new children (a leaf is its own rebuild; a one-input node is
//! rebuilt by its `with_input`), and its metrics (a `metrics` field) when it
//! has some. Written once here, below every layer with an operator (the
//! listing in `storage/`, the UDF operators and `PrefetchExec` in `plan/`, the
//! cluster job's wrappers in `cluster/`); a node with more children writes
//! its own.

/// Implements the common parts of `ExecutionPlan` inside an `impl
/// ExecutionPlan for T` block:
///
/// - `exec_boilerplate!(NAME, leaf, metrics)`: no children; `T` has fields
///   `properties: Arc<PlanProperties>` and `metrics: ExecutionPlanMetricsSet`;
/// - `exec_boilerplate!(NAME, one_input[, metrics])`: one child, the field
///   `input: Arc<dyn ExecutionPlan>`, and a method `with_input(&self, input)
///   -> T` that rebuilds the node over a new one.
macro_rules! exec_boilerplate {
    ($name:expr, leaf $(, $metrics:ident)?) => {
        fn children(&self) -> Vec<&std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
            vec![]
        }

        fn with_new_children(
            self: std::sync::Arc<Self>,
            _children: Vec<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>,
        ) -> datafusion::error::Result<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>
        {
            Ok(self)
        }

        $crate::util::exec_boilerplate::exec_boilerplate!(@common $name $(, $metrics)?);
    };
    ($name:expr, one_input $(, $metrics:ident)?) => {
        fn children(&self) -> Vec<&std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
            vec![&self.input]
        }

        fn with_new_children(
            self: std::sync::Arc<Self>,
            mut children: Vec<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>,
        ) -> datafusion::error::Result<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>
        {
            if children.len() != 1 {
                return datafusion::common::internal_err!("{} takes one input", $name);
            }
            Ok(std::sync::Arc::new(self.with_input(children.swap_remove(0))))
        }

        $crate::util::exec_boilerplate::exec_boilerplate!(@common $name $(, $metrics)?);
    };
    (@common $name:expr $(, $metrics:ident)?) => {
        fn name(&self) -> &str {
            $name
        }

        fn properties(&self) -> &std::sync::Arc<datafusion::physical_plan::PlanProperties> {
            &self.properties
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

        $(
            fn $metrics(&self) -> Option<datafusion::physical_plan::metrics::MetricsSet> {
                Some(self.$metrics.clone_inner())
            }
        )?
    };
}

pub(crate) use exec_boilerplate;
