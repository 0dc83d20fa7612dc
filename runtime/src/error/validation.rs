//! A validator's refusal (code 121, DocumentValidationFailure) read from
//! the driver's error: the document it names and, from the server's
//! `errInfo.details`, which rules the document broke.

use mongodb::bson::{Bson, Document};
use mongodb::error::{ErrorKind, WriteFailure};

/// DocumentValidationFailure.
pub const DOCUMENT_VALIDATION_FAILURE: i32 = 121;

/// The most rules a message names; the rest are counted.
const NAMED: usize = 3;

/// Where `e` is a validator's refusal: the `errInfo` of the write it
/// refused, where the server sent one (MongoDB 5.0 and later): a write
/// error's, or the command's own (as `findAndModify` answers), read from
/// the reply the driver keeps.
pub(crate) fn refusal(e: &mongodb::error::Error) -> Option<Option<Document>> {
    let refused = |code: i32| code == DOCUMENT_VALIDATION_FAILURE;
    match &*e.kind {
        ErrorKind::Command(c) if refused(c.code) => Some(
            e.server_response()
                .and_then(|r| r.get_document("errInfo").ok())
                .and_then(|i| Document::try_from(i).ok()),
        ),
        ErrorKind::Write(WriteFailure::WriteError(w)) if refused(w.code) => Some(w.details.clone()),
        ErrorKind::InsertMany(m) => m
            .write_errors
            .iter()
            .flatten()
            .find(|w| refused(w.code))
            .map(|w| w.details.clone()),
        _ => None,
    }
}

/// The refused document's `_id`, as the server names it
/// (`failingDocumentId`, MongoDB 5.0 and later).
pub(crate) fn failing_id(info: &Document) -> Option<Bson> {
    info.get("failingDocumentId").cloned()
}

/// The rules the document broke, as `field: reason` lines, from the
/// `details` of a refusal's `errInfo` (MongoDB 5.0 and later): at most a
/// few, then how many more.
pub(crate) fn broken_rules(info: &Document) -> Vec<String> {
    let mut found = Vec::new();
    if let Some(details) = info.get("details") {
        walk(details, &mut String::new(), &mut found);
    }
    found.dedup();
    if found.len() > NAMED {
        let more = found.len() - NAMED;
        found.truncate(NAMED);
        found.push(format!("and {more} more"));
    }
    found
}

/// Collects the reasons under `v`, `path` being the field it describes.
fn walk(v: &Bson, path: &mut String, found: &mut Vec<String>) {
    let d = match v {
        Bson::Array(a) => {
            for v in a {
                walk(v, path, found);
            }
            return;
        }
        Bson::Document(d) => d,
        _ => return,
    };
    let before = path.len();
    if let Ok(name) = d.get_str("propertyName") {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(name);
    }
    if let Some(i) = d.get("itemIndex").and_then(Bson::as_i32) {
        path.push_str(&format!(".{i}"));
    }
    let nested: Vec<&Bson> = d
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "specifiedAs" | "consideredValue"))
        .map(|(_, v)| v)
        .filter(|v| matches!(v, Bson::Array(_) | Bson::Document(_)))
        .collect();
    let found_before = found.len();
    for v in nested {
        walk(v, path, found);
    }
    if found.len() == found_before {
        if let Some(line) = leaf(d, path) {
            found.push(line);
        }
    }
    path.truncate(before);
}

/// One broken rule: `field: reason (found <type>)`.
fn leaf(d: &Document, path: &str) -> Option<String> {
    let reason = d.get_str("reason").ok()?;
    let mut line = match path {
        "" => reason.to_owned(),
        p => format!("`{p}`: {reason}"),
    };
    if let Ok(missing) = d.get_array("missingProperties") {
        let names: Vec<String> = missing
            .iter()
            .filter_map(Bson::as_str)
            .map(|m| format!("`{m}`"))
            .collect();
        line.push_str(&format!(" ({})", names.join(", ")));
    } else if let Ok(t) = d.get_str("consideredType") {
        line.push_str(&format!(" (found {t})"));
    }
    Some(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::doc;

    /// The shape mongod 5.0+ (and the test server) answer: the `anyOf` of
    /// the models' parts, then the part's `allOf`, then the property.
    #[test]
    fn rules_are_named_by_their_field_path() {
        let customer = doc! {"propertyName": "customer", "details": [
            {"operatorName": "bsonType", "specifiedAs": {"bsonType": "long"},
             "reason": "type did not match", "consideredValue": "x", "consideredType": "string"}
        ]};
        let items = doc! {"propertyName": "items", "details": [
            {"operatorName": "items", "reason": "At least one item did not match the sub-schema",
             "itemIndex": 1, "details": [
                {"operatorName": "properties", "propertiesNotSatisfied": [customer]}
            ]}
        ]};
        let required = doc! {"operatorName": "required", "specifiedAs": {"required": ["a", "b"]},
        "missingProperties": ["b"], "reason": "one or more required properties are missing"};
        let part = doc! {"operatorName": "allOf", "schemasNotSatisfied": [{"index": 0, "details": [
            {"operatorName": "properties", "propertiesNotSatisfied": [items]},
            required
        ]}]};
        let info = doc! {
            "failingDocumentId": 8,
            "details": {"operatorName": "$jsonSchema", "schemaRulesNotSatisfied": [
                {"operatorName": "anyOf", "schemasNotSatisfied": [{"index": 0, "details": [part]}]}
            ]}
        };
        assert_eq!(failing_id(&info), Some(Bson::Int32(8)));
        assert_eq!(
            broken_rules(&info),
            [
                "`items.1.customer`: type did not match (found string)",
                "one or more required properties are missing (`b`)",
            ]
        );
    }

    #[test]
    fn a_long_list_is_cut_and_counted() {
        let props: Vec<Document> = (0..5)
            .map(|i| doc! {"propertyName": format!("f{i}"), "details": [{"reason": "r"}]})
            .collect();
        let info = doc! {"details": {"propertiesNotSatisfied": props}};
        let rules = broken_rules(&info);
        assert_eq!(rules.len(), NAMED + 1);
        assert_eq!(rules[NAMED], "and 2 more");
    }

    #[test]
    fn no_details_no_rules() {
        assert!(broken_rules(&doc! {"failingDocumentId": 1}).is_empty());
    }
}
