//! Which Ingresses are ours: IngressClass selection.
//!
//! The order follows the Ingress API: `spec.ingressClassName`, else the deprecated
//! `kubernetes.io/ingress.class` annotation, else the cluster's default class. A named class is
//! ours when an IngressClass of that name has our controller, or, when no IngressClass of that
//! name exists, when the name is our configured class name (clusters without IngressClass
//! objects, and manifest directories, work without one).

use k8s_openapi::api::networking::v1::{Ingress, IngressClass};

use super::TranslateConfig;
use crate::snapshot::Objects;

/// The deprecated annotation naming an Ingress's class.
pub(crate) const LEGACY_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";
/// The annotation marking an IngressClass as the cluster default.
pub(crate) const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";

/// How an Ingress was found to be ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Selected<'a> {
    /// By `spec.ingressClassName`.
    ClassName,
    /// By the deprecated `kubernetes.io/ingress.class` annotation, naming this class.
    LegacyAnnotation(&'a str),
    /// It names no class, and our class is the default (or we watch class-less Ingresses).
    Default,
}

/// Decides class membership for one translation.
pub(crate) struct ClassSelector<'a> {
    classes: &'a Objects<IngressClass, String>,
    config: &'a TranslateConfig,
    /// Whether class-less Ingresses are ours.
    take_classless: bool,
}

impl<'a> ClassSelector<'a> {
    pub(crate) fn new(classes: &'a Objects<IngressClass, String>, config: &'a TranslateConfig) -> Self {
        let default_is_ours = classes.values().any(|class| {
            is_our_controller(class, config)
                && class
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
                    .is_some_and(|v| v == "true")
        });
        ClassSelector {
            classes,
            config,
            take_classless: default_is_ours || config.watch_ingress_without_class,
        }
    }

    /// Whether a class name designates us.
    pub(crate) fn is_ours(&self, class: &str) -> bool {
        match self.classes.get(class) {
            Some(ingress_class) => is_our_controller(ingress_class, self.config),
            None => class == self.config.ingress_class,
        }
    }

    /// `Some(how)` when the Ingress is ours.
    pub(crate) fn select<'i>(&self, ingress: &'i Ingress) -> Option<Selected<'i>> {
        let by_field =
            ingress.spec.as_ref().and_then(|s| s.ingress_class_name.as_deref()).filter(|c| !c.is_empty());
        if let Some(class) = by_field {
            return self.is_ours(class).then_some(Selected::ClassName);
        }
        let by_annotation = ingress
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LEGACY_CLASS_ANNOTATION))
            .map(String::as_str)
            .filter(|c| !c.is_empty());
        if let Some(class) = by_annotation {
            return self.is_ours(class).then_some(Selected::LegacyAnnotation(class));
        }
        self.take_classless.then_some(Selected::Default)
    }
}

fn is_our_controller(class: &IngressClass, config: &TranslateConfig) -> bool {
    class.spec.as_ref().and_then(|s| s.controller.as_deref()) == Some(config.controller_name.as_str())
}
