# Approvers see the project argument masked.
package toolgate.log

mask contains "/arguments/project"
